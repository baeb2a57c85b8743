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

A second family, ``steps`` (``steps_problems``), has nothing to copy from the prompt: ``f(x)`` applies 2-3 steps
named in the docstring (``add one; double``), one line of the body each. The tiny preset's stdlib-trained model
copies neither a constant nor a parameter name from a prompt it was not trained on, so on the templates family a
held-out instance fails whatever RL rewards; on the steps family a held-out problem is a new composition of
phrase-to-line mappings that train problems exercise.
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


def synthetic_problems(seed: int, count: int, family: str = "templates") -> list[ExecProblem]:
    """``count`` problems (fewer only when every template's ``k`` range is used up), the same for the same seed.
    ``family="steps"``: compositions of steps instead (``steps_problems``)."""
    if family == "steps":
        return steps_problems(seed, count)
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


# The steps family: ``f(x)`` applies a sequence of 2-3 steps, each named in the docstring by a fixed phrase and
# written as one line of the body (``x = x * 2``). Nothing is copied from the prompt: each phrase maps to its line,
# and a problem is a sequence. Held out by sequence, a val problem is a new composition of steps train has.
@dataclass(frozen=True)
class Step:
    key: str  # in the problem id
    phrase: str  # in the docstring
    line: str  # the body's line
    fn: Callable[[int], int]


STEPS: tuple[Step, ...] = (
    Step("add1", "add one", "x = x + 1", lambda x: x + 1),
    Step("add10", "add ten", "x = x + 10", lambda x: x + 10),
    Step("sub2", "subtract two", "x = x - 2", lambda x: x - 2),
    Step("double", "double", "x = x * 2", lambda x: x * 2),
    Step("triple", "triple", "x = x * 3", lambda x: x * 3),
    Step("negate", "negate", "x = -x", lambda x: -x),
    Step("square", "square", "x = x * x", lambda x: x * x),
    Step("halve", "halve, rounding down", "x = x // 2", lambda x: x // 2),
    Step("abs", "take the absolute value", "x = abs(x)", abs),
    Step("mod5", "take the remainder modulo 5", "x = x % 5", lambda x: x % 5),
)
STEPS_NAME = "steps"


def _run_steps(seq: tuple[Step, ...], x: int) -> int:
    for s in seq:
        x = s.fn(x)
    return x


def _render_steps(seq: tuple[Step, ...], examples: list[int]) -> ExecProblem:
    doc = "; ".join(["Start with x", *(s.phrase for s in seq)]) + ". Return the result."
    example = examples[0]
    prompt = (f"def f(x: int) -> int:\n"
              f'    """{doc}\n'
              f"    >>> f({example!r})\n"
              f"    {_run_steps(seq, example)!r}\n"
              f'    """\n')
    cases = [f"assert candidate({x!r}) == {_run_steps(seq, x)!r}" for x in examples[1:]]
    tests = "def check(candidate):\n" + "".join(f"    {c}\n" for c in cases)
    body = "".join(f"    {s.line}\n" for s in seq) + "    return x\n"
    pid = f"{SOURCE}/{STEPS_NAME}_" + "_".join(s.key for s in seq)
    return ExecProblem(problem_id=pid, prompt=prompt, entry_point="f", tests=tests, test_cases=cases,
                       reference_solution=body, source=SOURCE, split_unit=pid)


def steps_problems(seed: int, count: int) -> list[ExecProblem]:
    """``count`` distinct step sequences (2 or 3 steps; fewer only when all are used), each with fresh inputs. A
    problem's split unit is its sequence, so a val problem is a composition train never had."""
    rng = random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    out: list[ExecProblem] = []
    total = len(STEPS) ** 2 + len(STEPS) ** 3
    while len(out) < min(count, total):
        seq = tuple(rng.choice(STEPS) for _ in range(rng.randint(2, 3)))
        if tuple(s.key for s in seq) in seen:
            continue
        seen.add(tuple(s.key for s in seq))
        n_cases = rng.randint(3, 5)
        examples: list[int] = []
        while len(examples) < n_cases + 1:  # distinct inputs: the doc example and the test cases
            x = rng.randint(-20, 20)
            if x not in examples:
                examples.append(x)
        out.append(_render_steps(seq, examples))
    return out
