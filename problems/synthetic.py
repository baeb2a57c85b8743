"""A small synthetic family of executable problems, shipped with the project (the tiny preset and the tests use it).

Each template is a one-line Python function over an int, a string or a list of ints, with one integer parameter
``k`` baked into it (``add_7(x)`` returns ``x + 7``): a typed signature, a docstring with one example, a one-line
reference body, and 3-5 separate test cases. They are deliberately easy, so a tiny model trained here for a short
while can reach a non-zero pass rate (RL needs a reward that is not always 0).

Generation is deterministic in ``(seed, count)``: problems are drawn round-robin over the templates, each with a
fresh ``k`` and fresh test inputs from ``random.Random(seed)``. The expected values come from the same Python
function the reference body spells out, and the problems stage still runs every reference in the sandbox.

The split unit is the template (``synthetic/<template>``): train and val hold different templates, not the same
template with other constants. Two problems of one template differ only in ``k``, so a parameter split would put
near-copies of every val problem into train; holding whole templates out measures what it should (solving a kind
of task not seen in training) at the cost of a coarse split over few units.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from codemill.problems.problem import ExecProblem

SYNTHETIC_CODE_VERSION = "synthetic-v1"
SOURCE = "synthetic"


@dataclass(frozen=True)
class Template:
    name: str  # the function is named ``<name>_<k>``
    arg: str  # parameter name
    arg_type: str  # annotation of the parameter
    ret_type: str
    doc: str  # docstring sentence, formatted with k
    body: str  # the reference expression, formatted with k
    fn: Callable[[Any, int], Any]  # the same computation in Python, for the expected values
    k_range: tuple[int, int]
    inputs: Callable[[random.Random], Any]


def _int(r: random.Random) -> int:
    return r.randint(-50, 50)


def _word(r: random.Random) -> str:
    return "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(1, 8)))


def _ints(r: random.Random) -> list[int]:
    return [r.randint(-20, 20) for _ in range(r.randint(1, 6))]


TEMPLATES: tuple[Template, ...] = (
    Template("add", "x", "int", "int", "Return x plus {k}.", "x + {k}", lambda x, k: x + k, (1, 99), _int),
    Template("subtract", "x", "int", "int", "Return x minus {k}.", "x - {k}", lambda x, k: x - k, (1, 99), _int),
    Template("times", "x", "int", "int", "Return x multiplied by {k}.", "x * {k}", lambda x, k: x * k, (2, 20), _int),
    Template("mod", "x", "int", "int", "Return the remainder of x divided by {k}.", "x % {k}",
             lambda x, k: x % k, (2, 20), _int),
    Template("at_least", "x", "int", "int", "Return x, or {k} if x is smaller than {k}.", "max(x, {k})",
             lambda x, k: max(x, k), (-20, 20), _int),
    Template("repeat", "s", "str", "str", "Return the string s repeated {k} times.", "s * {k}",
             lambda s, k: s * k, (2, 5), _word),
    Template("reverse_repeat", "s", "str", "str", "Return s reversed, repeated {k} times.", "s[::-1] * {k}",
             lambda s, k: s[::-1] * k, (1, 4), _word),
    Template("shout", "s", "str", "str", "Return s in upper case followed by {k} exclamation marks.",
             "s.upper() + '!' * {k}", lambda s, k: s.upper() + "!" * k, (1, 5), _word),
    Template("prefix", "s", "str", "str", "Return the first {k} characters of s.", "s[:{k}]",
             lambda s, k: s[:k], (1, 6), _word),
    Template("sum_plus", "xs", "list[int]", "int", "Return the sum of the numbers in xs plus {k}.",
             "sum(xs) + {k}", lambda xs, k: sum(xs) + k, (1, 50), _ints),
    Template("max_times", "xs", "list[int]", "int", "Return the largest number in xs multiplied by {k}.",
             "max(xs) * {k}", lambda xs, k: max(xs) * k, (2, 10), _ints),
    Template("keep_above", "xs", "list[int]", "list[int]", "Return the numbers in xs that are greater than {k}, "
             "in order.", "[x for x in xs if x > {k}]", lambda xs, k: [x for x in xs if x > k], (-5, 10), _ints),
    Template("count_above", "xs", "list[int]", "int", "Return how many numbers in xs are greater than {k}.",
             "len([x for x in xs if x > {k}])", lambda xs, k: len([x for x in xs if x > k]), (-5, 10), _ints),
)


def _render(t: Template, k: int, examples: list[Any], n_cases: int) -> ExecProblem:
    name = f"{t.name}_{k}".replace("-", "neg")
    example = examples[0]
    prompt = (f"def {name}({t.arg}: {t.arg_type}) -> {t.ret_type}:\n"
              f'    """{t.doc.format(k=k)}\n'
              f"    >>> {name}({example!r})\n"
              f"    {t.fn(example, k)!r}\n"
              f'    """\n')
    cases = [f"assert candidate({x!r}) == {t.fn(x, k)!r}" for x in examples[1:1 + n_cases]]
    tests = "def check(candidate):\n" + "".join(f"    {c}\n" for c in cases)
    return ExecProblem(problem_id=f"{SOURCE}/{name}", prompt=prompt, entry_point=name, tests=tests,
                       test_cases=cases, reference_solution=f"    return {t.body.format(k=k)}\n", source=SOURCE,
                       split_unit=f"{SOURCE}/{t.name}")


def synthetic_problems(seed: int, count: int) -> list[ExecProblem]:
    """``count`` problems (fewer only when every template's ``k`` range is used up), the same for the same seed."""
    rng = random.Random(seed)
    used: dict[str, set[int]] = {t.name: set() for t in TEMPLATES}
    out: list[ExecProblem] = []
    exhausted: set[str] = set()
    i = 0
    while len(out) < count and len(exhausted) < len(TEMPLATES):
        t = TEMPLATES[i % len(TEMPLATES)]
        i += 1
        lo, hi = t.k_range
        free = [k for k in range(lo, hi + 1) if k not in used[t.name]]
        if not free:
            exhausted.add(t.name)
            continue
        k = rng.choice(free)
        used[t.name].add(k)
        n_cases = rng.randint(3, 5)
        examples: list[Any] = []
        while len(examples) < n_cases + 1:  # distinct inputs: the doc example and the test cases
            x = t.inputs(rng)
            if x not in examples:
                examples.append(x)
        out.append(_render(t, k, examples, n_cases))
    return out
