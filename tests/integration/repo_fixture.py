"""A small pure-Python repository with a pytest suite and one SWE-bench-format task on it, built by the tests.

``mathlib.ops.clamp`` returns ``lo`` for values above ``hi`` at the base commit; the gold ``patch`` fixes it;
``test_patch`` adds ``tests/test_clamp.py``, whose ``test_clamp_high`` fails before the fix (FAIL_TO_PASS) while
the rest pass before and after (PASS_TO_PASS).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from codemill.repos.git import git
from codemill.repos.task import RepoTask

OPS = '''"""Small numeric helpers."""


def clamp(x, lo, hi):
    """x limited to [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return {high}
    return x


def mean(xs):
    if not xs:
        raise ValueError("mean of nothing")
    return sum(xs) / len(xs)


def span(xs):
    return max(xs) - min(xs)
'''

TEST_OPS = '''import pytest

from mathlib.ops import mean, span


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


@pytest.mark.parametrize("xs,expected", [([1, 5], 4), ([3], 0), ([-2, 2], 4)])
def test_span(xs, expected):
    assert span(xs) == expected
'''

TEST_CLAMP = '''from mathlib.ops import clamp


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_high():
    assert clamp(50, 0, 10) == 10
'''


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def make_repo(root: Path) -> tuple[Path, RepoTask]:
    """The repository at ``root/mathlib-repo`` and its task."""
    repo = root / "mathlib-repo"
    repo.mkdir(parents=True)
    _write(repo, {"mathlib/__init__.py": '"""mathlib."""\n', "mathlib/ops.py": OPS.format(high="lo"),
                  "tests/test_ops.py": TEST_OPS, "pyproject.toml": '[project]\nname = "mathlib"\nversion = "0"\n\n'
                                                                   '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
                  "README.md": "mathlib\n"})
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "mathlib with a clamp bug")
    base = git(repo, "rev-parse", "HEAD").strip()
    _write(repo, {"mathlib/ops.py": OPS.format(high="hi")})
    patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    _write(repo, {"tests/test_clamp.py": TEST_CLAMP})
    git(repo, "add", "-N", "tests/test_clamp.py")
    test_patch = git(repo, "diff")
    git(repo, "reset", "-q")
    (repo / "tests" / "test_clamp.py").unlink()
    # A later commit that holds the fix: what a leaky snapshot would show through `git log --all`.
    _write(repo, {"mathlib/ops.py": OPS.format(high="hi")})
    git(repo, "commit", "-q", "-am", "fix clamp (the answer)")
    git(repo, "checkout", "-q", base)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "main"], check=True)
    p2p = ["tests/test_ops.py::test_mean", "tests/test_ops.py::test_mean_empty",
           "tests/test_ops.py::test_span[xs0-4]", "tests/test_ops.py::test_span[xs1-0]",
           "tests/test_ops.py::test_span[xs2-4]", "tests/test_clamp.py::test_clamp_low",
           "tests/test_clamp.py::test_clamp_inside"]
    task = RepoTask("mathlib__clamp-1", "mathlib-repo", base, "clamp(50, 0, 10) returns 0 instead of 10.", patch,
                    test_patch, ("tests/test_clamp.py::test_clamp_high",), tuple(p2p), "2026-01-01T00:00:00Z")
    return repo, task


def prepared(tmp: Path) -> dict:
    """The repository, its task, a cache in ``tmp``, the task's snapshot and environment, and a sandbox."""
    from codemill.repos.cache import RepoCache
    from codemill.repos.pytest_run import repo_sandbox

    repo, task = make_repo(tmp)
    cache = RepoCache(tmp / "cache")
    snapshot = cache.snapshot(repo, task.base_commit)
    return {"repo": repo, "task": task, "cache": cache, "snapshot": snapshot, "env": cache.env(snapshot),
            "sandbox": repo_sandbox(120), "scratch": tmp, "tmp": tmp}
