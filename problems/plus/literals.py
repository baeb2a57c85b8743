"""Plain data as Python source, and the comparison the augmented tests assert with.

A new test case is source text (``assert _plus_eq(candidate(3, 'ab'), 7)``) run by the judge, so every input
and expected value must print as a literal that evaluates back to the same value: ``repr`` does, except for
non-finite floats (``inf``, ``nan``) and for sets, whose iteration order follows the string hash seed (the
host's differs from the sandbox's); sets print sorted, so an artifact is byte-identical across runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# The tolerance helper, as source: the judge defines it from this text, and the host executes the same text
# (``plus_eq``), so the two can never disagree. EvalPlus compares float outputs with an absolute tolerance;
# everything else is ``==``, as the original tests compare.
PLUS_EQ_SOURCE = '''
def _plus_eq(got, want, atol=ATOL, rtol=1e-07):
    """got equals want; floats (also inside lists, tuples, dicts) within atol/rtol, nan equal to nan."""
    import math
    if type(want) is float:
        if type(got) not in (int, float):
            return False
        if math.isnan(want) or math.isnan(got):
            return math.isnan(want) and math.isnan(got)
        return math.isclose(got, want, rel_tol=rtol, abs_tol=atol)
    if type(want) in (list, tuple):
        return (type(got) is type(want) and len(got) == len(want)
                and all(_plus_eq(g, w, atol, rtol) for g, w in zip(got, want)))
    if type(want) is dict:
        return (type(got) is dict and got.keys() == want.keys()
                and all(_plus_eq(got[k], want[k], atol, rtol) for k in want))
    return got == want
'''


def plus_eq_source(atol: float) -> str:
    return PLUS_EQ_SOURCE.replace("ATOL", repr(float(atol)))


def plus_eq(atol: float) -> Callable[[Any, Any], bool]:
    """The host's copy of ``_plus_eq`` (executed from the same source the tests carry)."""
    namespace: dict[str, Any] = {}
    exec(plus_eq_source(atol), namespace)  # noqa: S102 - our own constant source
    fn: Callable[[Any, Any], bool] = namespace["_plus_eq"]
    return fn


def _float(x: float) -> str:
    if math.isnan(x):
        return "float('nan')"
    if math.isinf(x):
        return "float('inf')" if x > 0 else "float('-inf')"
    return repr(x)


def to_source(value: Any) -> str:
    """A Python expression evaluating to ``value`` (plain data only; TypeError otherwise)."""
    kind = type(value)
    if kind is float:
        return _float(value)
    if value is None or kind in (bool, int, str, bytes):
        return repr(value)
    if kind is complex:
        return f"complex({_float(value.real)}, {_float(value.imag)})"
    if kind is list:
        return "[" + ", ".join(to_source(v) for v in value) + "]"
    if kind is tuple:
        items = [to_source(v) for v in value]
        return "(" + items[0] + ",)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    if kind is dict:
        return "{" + ", ".join(f"{to_source(k)}: {to_source(v)}" for k, v in value.items()) + "}"
    if kind in (set, frozenset):
        items = sorted(to_source(v) for v in value)
        body = "{" + ", ".join(items) + "}" if items else ""
        if kind is frozenset:
            return f"frozenset({body})"
        return body or "set()"
    raise TypeError(f"not plain data: {kind.__module__}.{kind.__qualname__}")


def call_source(args: tuple[Any, ...]) -> str:
    """``candidate(<args>)``."""
    return "candidate(" + ", ".join(to_source(a) for a in args) + ")"


def key(value: Any) -> str:
    """A hashable identity for plain data (lists and dicts are unhashable), type-exact: ``1`` and ``True`` and
    ``1.0`` differ."""
    return to_source(value)
