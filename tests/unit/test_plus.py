"""problems.plus pure pieces: seed extraction, type-aware mutation, literals and tolerance, mutants, set cover, and
the augmented test program (run in-process here; the sandboxed path is tests/integration/test_augmented_tests.py)."""

from __future__ import annotations

import ast
import math
import random

import pytest

from codemill.problems.plus.augment import augmented_problem, count_asserts
from codemill.problems.plus.inputs import seed_inputs
from codemill.problems.plus.literals import key, plus_eq, to_source
from codemill.problems.plus.mutants import mutants
from codemill.problems.plus.mutate import Mutator, Pool
from codemill.problems.plus.reduce import greedy_cover
from codemill.problems.problem import ExecProblem

CHECK = """
def check(candidate):
    assert candidate([1, 2, 3], 2) == 5
    assert candidate([], -1) == 0
    assert candidate([1, 2, 3], 2) == 5
    assert abs(candidate((1.5, 2.0), {'a': 1}) - 3.5) < 1e-6
    assert candidate(x, 2) == 1
    assert candidate([1], n=2) == 1
    for i in range(3):
        assert candidate([i], i) == i
    assert candidate(*args) == 0
"""


def test_seed_inputs_are_the_literal_calls_in_order_without_duplicates():
    assert seed_inputs(CHECK, "f") == [([1, 2, 3], 2), ([], -1), ((1.5, 2.0), {"a": 1})]


def test_seed_inputs_also_find_calls_by_entry_name_and_survive_bad_tests():
    tests = "def check(candidate):\n    assert add(2, 3) == 5\n    assert candidate('x') == 'x'\n"
    assert seed_inputs(tests, "add") == [(2, 3), ("x",)]
    assert seed_inputs("def check(:", "f") == []


def kinds(v, depth=0) -> set[tuple[int, str]]:
    """Every (depth, type name) inside a value: a mutation must introduce none."""
    out = {(depth, type(v).__name__)}
    if type(v) in (list, tuple, set, frozenset):
        for x in v:
            out |= kinds(x, depth + 1)
    elif type(v) is dict:
        for k, x in v.items():
            out |= kinds(k, depth + 1) | kinds(x, depth + 1)
    return out


SEEDS = [(3, "abc", [1, 2, 3]), (0, "", [4]), (-2, "zz", [5, 6]), (True, "q", [7])]
NESTED = [([[1, 2], [3]], {"a": [1.5], "b": [2.5]}, (1, "x"), {1, 2})]


@pytest.mark.parametrize("seeds", [SEEDS, NESTED])
def test_mutation_keeps_types_and_element_types(seeds):
    rng = random.Random(0)
    mutator = Mutator(rng, Pool.of(seeds))
    for _ in range(300):
        parent = rng.choice(seeds)
        child = mutator.mutate_args(parent)
        assert len(child) == len(parent)
        for a, b in zip(parent, child, strict=True):
            assert type(a) is type(b)
            if type(a) is tuple:
                assert len(a) == len(b)
            assert kinds(b) <= kinds(a), (a, b)


def test_mutation_changes_inputs_and_keeps_sign_classes_and_alphabet():
    seeds = [(5, "abc"), (0, "ab"), (-4, "cab")]
    mutator = Mutator(random.Random(1), Pool.of(seeds))
    changed = 0
    for _ in range(200):
        for parent in seeds:
            child = mutator.mutate_args(parent)
            changed += child != parent
            n, s = child
            assert (n >= 1) if parent[0] >= 1 else (n >= 0) if parent[0] == 0 else (n <= -1)
            assert set(s) <= set("abc")
    assert changed > 500


def test_mutation_is_deterministic_from_its_seed():
    def run(seed):
        mutator = Mutator(random.Random(seed), Pool.of(SEEDS + NESTED))
        return [key(mutator.mutate_args(p)) for p in SEEDS + NESTED for _ in range(20)]

    assert run(7) == run(7)
    assert run(7) != run(8)


@pytest.mark.parametrize("value", [1, True, -2.5, float("inf"), float("-inf"), "a'\"\n", b"\x00", None, (1,), (),
                                   [1, (2, 3)], {"k": [1.0]}, {3, 1, 2}, set(), frozenset({"b", "a"}),
                                   complex(1, -2)])
def test_to_source_evaluates_back_to_the_same_value(value):
    text = to_source(value)
    back = eval(text)  # noqa: S307 - our own literal
    assert type(back) is type(value) and back == value


def test_to_source_is_stable_for_sets_and_refuses_objects():
    assert to_source({"b", "a", "c"}) == "{'a', 'b', 'c'}"
    assert math.isnan(eval(to_source(float("nan"))))  # noqa: S307
    with pytest.raises(TypeError):
        to_source(object())
    assert key(1) != key(True) != key(1.0)


def test_plus_eq_tolerates_float_error_only_where_the_expected_value_is_float():
    eq = plus_eq(1e-6)
    assert eq(0.1 + 0.2, 0.3) and eq([1, 0.30000001], [1, 0.3]) and eq({"a": (1.0,)}, {"a": (1.0000001,)})
    assert eq(float("nan"), float("nan")) and eq(3, 3.0)
    assert not eq(0.31, 0.3) and not eq("3", 3.0) and not eq([1, 2], (1, 2)) and not eq([0.3], [0.3, 0.3])
    assert not eq(1, 2) and eq("ab", "ab")


PROMPT = 'def helper(x):\n    return x * 2\n\n\ndef f(xs, t):\n    """Sum of the items above t."""\n'
SOLUTION = "    total = 0\n    for x in xs:\n        if x > t and x != 0:\n            total += x\n    return total\n"


def test_mutants_are_distinct_compile_and_touch_only_the_solution():
    out = mutants(PROMPT, SOLUTION, limit=50, seed=0)
    original = ast.unparse(ast.parse(PROMPT + SOLUTION))
    assert len(out) >= 5 and len(set(out)) == len(out) and original not in out
    helper = "def helper(x):\n    return x * 2"
    for m in out:
        compile(m, "<m>", "exec")
        assert m.startswith(helper)
    assert any("x >= t" in m for m in out) and any("total -= x" in m for m in out)
    assert mutants(PROMPT, SOLUTION, limit=4, seed=0) == mutants(PROMPT, SOLUTION, limit=4, seed=0)
    assert len(mutants(PROMPT, SOLUTION, limit=4, seed=0)) == 4
    assert mutants(PROMPT, "    return (", limit=4) == []


def test_greedy_cover_kills_what_all_inputs_kill_with_fewest_inputs():
    kills = [frozenset({0, 1}), frozenset({1, 2, 3}), frozenset({3}), frozenset({4}), frozenset({0, 2}),
             frozenset()]
    chosen = greedy_cover(kills)
    assert set().union(*(kills[i] for i in chosen)) == {0, 1, 2, 3, 4}
    assert chosen == [1, 0, 3]  # the biggest first; ties go to the earliest
    assert greedy_cover(kills, covered={0, 1, 2, 3}) == [3]
    assert greedy_cover(kills, covered={0, 1, 2, 3, 4}) == []
    assert greedy_cover([]) == []


def test_greedy_cover_finds_the_single_input_covering_everything():
    kills = [frozenset({0}), frozenset({1}), frozenset({2}), frozenset({0, 1, 2})]
    assert greedy_cover(kills) == [3]


def test_augmented_program_runs_the_original_check_then_the_new_cases():
    problem = ExecProblem("p", PROMPT, "f", "def check(candidate):\n    assert candidate([1, 5], 2) == 5\n",
                          reference_solution=SOLUTION)
    aug = augmented_problem(problem, [(([0, 3, 4], 3), 4), (([0.5, 0.25], 0.0), 0.75)], atol=1e-6)
    assert count_asserts(problem.tests) == 1 and len(aug.test_cases) == 3

    def run(candidate):
        ns: dict = {}
        exec(aug.tests, ns)  # noqa: S102
        ns["check"](candidate)
        return [_case(ns, c, candidate) for c in aug.test_cases]

    def right(xs, t):
        return sum(x for x in xs if x > t)

    def off_by_one(xs, t):  # passes the original test, fails the first new case
        return sum(x for x in xs if x >= t)

    def wrong_everywhere(xs, t):
        return 0

    assert run(right) == [True, True, True]
    with pytest.raises(AssertionError):
        run(off_by_one)
    ns: dict = {}
    exec(aug.tests, ns)  # noqa: S102
    assert [_case(ns, c, off_by_one) for c in aug.test_cases] == [True, False, True]
    assert [_case(ns, c, wrong_everywhere) for c in aug.test_cases] == [False, False, False]


def _case(ns: dict, case: str, candidate) -> bool:
    try:
        exec(case, dict(ns, candidate=candidate))  # noqa: S102
        return True
    except AssertionError:
        return False
