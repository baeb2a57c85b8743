"""Mined doctest problems judged for real: the JudgePool's sandboxes, the candidate behind the plain-data proxy."""

from __future__ import annotations

import pytest

from codemill.problems.mining import mine_doctest_problems
from codemill.problems.problem import ExecProblem

SOURCE = '''\
import math
from fractions import Fraction


def clamp(x, lo=0, hi=10):
    """Clamp x into [lo, hi].

    >>> clamp(5)
    5
    >>> clamp(-3)
    0
    >>> clamp(30, hi=20)
    20
    >>> clamp(1, lo=2, hi=1)
    Traceback (most recent call last):
        ...
    ValueError: empty range [2, 1]
    """
    if lo > hi:
        raise ValueError(f"empty range [{lo}, {hi}]")
    return max(lo, min(hi, x))


def stats(xs):
    """
    >>> data = [1.0, 2.0, 4.0]
    >>> result = stats(data)
    >>> result["mean"]  # doctest: +ELLIPSIS
    2.333...
    >>> sorted(result)  # doctest: +NORMALIZE_WHITESPACE
    ['max',
     'mean']
    >>> stats([]) is None
    True
    >>> stats([4])
    {'mean': 4.0, 'max': 4}
    """
    if not xs:
        return None
    return {"mean": math.fsum(xs) / len(xs), "max": max(xs)}


def halves(n):
    """The result is a Fraction: not plain data, so the reference cannot pass.

    >>> halves(3)
    Fraction(3, 2)
    """
    return Fraction(n, 2)


def loud(x):
    """Works only through printing inside the function: the judge never sees the candidate's stdout.

    >>> loud(2)
    2
    """
    print(x)
'''


@pytest.fixture(scope="module")
def problems() -> dict[str, ExecProblem]:
    mined, counts = mine_doctest_problems([("handwritten", "mod.py", SOURCE)])
    assert counts["kept"] == 4
    return {p.entry_point: p for p in mined}


@pytest.fixture(scope="module")
def pool():
    from codemill.sandbox import Limits
    from codemill.sandbox.judge_pool import JudgePool

    with JudgePool(Limits(wall_s=5, cpu_s=5), workers=2) as p:
        yield p


def test_references_verify_and_wrong_completions_fail(problems: dict[str, ExecProblem], pool) -> None:
    clamp, stats = problems["clamp"], problems["stats"]
    ellipsis_wrong = (stats.reference_solution or "").replace("/ len(xs)", "/ len(xs) + 0.1")
    items = [
        (clamp, clamp.reference_solution or ""),
        (stats, stats.reference_solution or ""),
        (problems["halves"], problems["halves"].reference_solution or ""),
        (problems["loud"], problems["loud"].reference_solution or ""),
        (clamp, "    return x\n"),  # ignores the bounds and never raises: only clamp(5) passes
        (clamp, "    return max(lo, min(hi, x))\n"),  # no exception: three of four
        (clamp, "    if lo > hi:\n        raise ValueError('bad')\n    return max(lo, min(hi, x))\n"),  # message
        (clamp, "    raise KeyError(x)\n"),
        (stats, ellipsis_wrong),  # the mean is off (ELLIPSIS does not hide it): two cases of four fail
        (stats, "    return {'mean': 0.0, 'max': 0, 'extra': 1}\n"),  # wrong everywhere
    ]
    judged = pool.judge_all([p.request(c) for p, c in items])
    verdicts = [(j.passed, round(j.partial, 3)) for j in judged]
    assert verdicts[0] == (True, 1.0), judged[0]
    assert verdicts[1] == (True, 1.0), judged[1]
    assert not judged[2].passed and judged[2].kind == "bad_data"  # the verification step drops it
    assert not judged[3].passed and judged[3].kind == "failed"  # ... and this one
    assert verdicts[4] == (False, 0.25)
    assert verdicts[5] == (False, 0.75)
    assert verdicts[6] == (False, 0.75)
    assert verdicts[7] == (False, 0.0)
    assert verdicts[8] == (False, 0.5)  # `sorted(result)` is its own case: the earlier `result["mean"]` is not in it
    assert verdicts[9] == (False, 0.0)
    assert "Failed example" in judged[4].error
