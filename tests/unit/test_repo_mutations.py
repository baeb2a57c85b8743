"""Bug-injection operators: each rewrites exactly its site, leaves the rest of the file as it was, and compiles."""

from __future__ import annotations

import ast
import difflib

import pytest

from codemill.repos.mutate import OPERATORS, mutations, sample
from codemill.repos.synthesis import defined_tests, hide_functions

SOURCE = '''"""A module."""

# a comment the rewrites must keep


def clip(x, lo, hi):
    """Docstring with 1 + 2 < 3 in it."""
    if x < lo and lo is not None:
        x = lo
    total = x + 1
    total -= 1
    print("checked", total)
    return max(lo, min(x, hi))


def head(xs, n=2):
    return xs[:n]
'''


def _changed_lines(new: str) -> list[str]:
    return [ln for ln in difflib.unified_diff(SOURCE.splitlines(), new.splitlines(), lineterm="", n=0)
            if ln[:1] in "+-" and ln[:3] not in ("---", "+++")]


@pytest.mark.parametrize("operator,expected", [
    ("flip_comparison", ["-    if x < lo and lo is not None:", "+    if x >= lo and lo is not None:"]),
    ("flip_arithmetic", ["-    total = x + 1", "+    total = x - 1"]),
    ("off_by_one", ["-    total = x + 1", "+    total = x + 2"]),
    ("drop_condition", ["-    if x < lo and lo is not None:", "+    if (x < lo):"]),
    ("drop_branch", ["-    if x < lo and lo is not None:", "-        x = lo"]),
    ("drop_statement", ["-        x = lo", "+        pass"]),
    ("drop_return", ["-    return max(lo, min(x, hi))"]),
    ("swap_arguments", ["-    print(\"checked\", total)", "+    print(total, \"checked\")"]),
])
def test_each_operator_rewrites_its_first_site_only(operator, expected):
    found = [m for m in mutations("m.py", SOURCE, (operator,))]
    assert found, operator
    first = min(found, key=lambda m: m.line)
    assert _changed_lines(first.source) == expected
    assert "# a comment the rewrites must keep" in first.source and ast.parse(first.source)
    assert first.function == "clip" and first.operator == operator


def test_docstrings_are_never_mutated_and_every_mutant_differs():
    found = list(mutations("m.py", SOURCE))
    assert {m.operator for m in found} == set(OPERATORS)
    assert all("1 + 2 < 3" in m.source for m in found)
    assert all(ast.dump(ast.parse(m.source)) != ast.dump(ast.parse(SOURCE)) for m in found)
    assert any(m.function == "head" and "xs[:(n) + 1]" in m.source for m in found)


def test_sampling_is_seeded_and_bounded_per_operator():
    found = list(mutations("m.py", SOURCE))
    a, b = sample(found, 1, seed=3), sample(found, 1, seed=3)
    assert a == b and len(a) == len(OPERATORS)
    assert all(sum(m.operator == op for m in sample(found, 2, seed=0)) <= 2 for op in OPERATORS)


def test_hidden_tests_lose_their_decorators_and_classes_keep_a_body():
    tests = ("import pytest\n\n\n@pytest.mark.parametrize('x', [1, 2])\ndef test_a(x):\n    assert x\n\n\n"
             "class TestB:\n    def test_b(self):\n        assert 1\n\n\ndef test_c():\n    assert 1\n")
    assert defined_tests(tests) == {"test_a", "TestB", "TestB.test_b", "test_c"} - {"TestB"}
    out = hide_functions(tests, ["test_a", "TestB.test_b"])
    assert out is not None and "test_a" not in out and "test_b" not in out and "parametrize" not in out
    assert "class TestB:\n    pass\n" in out and "def test_c" in out
    assert hide_functions(tests, ["test_missing"]) is None


def test_an_inherited_test_is_hidden_where_its_mixin_defines_it(tmp_path):
    from codemill.repos.synthesis import hidden_files

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text(
        "class CacheMixin:\n    def test_get(self):\n        assert 1\n\n    def test_put(self):\n        assert 1\n")
    (tmp_path / "tests" / "test_lru.py").write_text(
        "import unittest\nfrom tests import CacheMixin\n\n\nclass LRUTest(unittest.TestCase, CacheMixin):\n"
        "    def test_lru(self):\n        assert 1\n")
    (tmp_path / "tests" / "test_other.py").write_text(
        "class Other:\n    def test_get(self):\n        assert 1\n")
    hidden = hidden_files(tmp_path, ["tests/test_lru.py::LRUTest::test_get", "tests/test_lru.py::LRUTest::test_lru"])
    assert hidden is not None and set(hidden) == {"tests/__init__.py", "tests/test_lru.py"}
    assert b"test_get" not in hidden["tests/__init__.py"] and b"test_put" in hidden["tests/__init__.py"]
    assert b"test_lru" not in hidden["tests/test_lru.py"]
    assert hidden_files(tmp_path, ["tests/test_lru.py::LRUTest::test_missing"]) is None


def test_a_task_without_failing_tests_is_refused(tmp_path):
    import json as _json

    from codemill.repos.task import TaskFileError, read_tasks

    row = {"instance_id": "a", "repo": "r", "base_commit": "c" * 40, "patch": "p", "test_patch": "t",
           "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]"}
    path = tmp_path / "tasks.jsonl"
    path.write_text(_json.dumps(row) + "\n")
    with pytest.raises(TaskFileError, match="tasks.jsonl:1: FAIL_TO_PASS is empty"):
        read_tasks(path)
