"""What of an agent's changes reaches the grader, and what in them deserves a look.

The grader applies the agent's changes to a fresh copy of the snapshot, but not all of them (``screen``):
- **tests**: the files the task's tests live in and the ones ``test_patch`` touches are restored to the task's
  version; files added under test folders are removed; edits to other test files are dropped;
- **test configuration** that could change what runs or how it is reported: ``conftest.py`` anywhere,
  ``pytest.ini``, ``tox.ini``, ``.pth`` files, ``sitecustomize.py`` / ``usercustomize.py``, and the pytest
  sections of ``setup.cfg`` and ``pyproject.toml`` (the file's change is dropped when that section changed);
- **git internals** (anything under a ``.git`` folder), **bytecode** (``__pycache__``, ``.pyc``) and symbolic
  links.
Every drop that an honest fix has no reason to make is recorded as suspicious, and so is a kept source file that
newly mentions the runner's internals, process exits, frame or trace hooks, or the network (``INTERNALS``).
"""

from __future__ import annotations

import configparser
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from codemill.repos.task import RepoTask

TEST_DIRS = {"test", "tests", "testing"}
CONFIG_NAMES = {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "sitecustomize.py", "usercustomize.py",
                "pytest.toml", ".pytest.toml"}
INTERNALS = {
    "pytest internals": r"\b_pytest\b|\bpytest_\w+\s*\(|^\s*(?:import|from)\s+pytest\b",
    "sys.modules": r"\bsys\.modules\b",
    "process exit": r"\bos\._exit\b|\batexit\b|\bos\.kill\b",
    "frame or trace hooks": r"\bsys\._getframe\b|\binspect\.(?:currentframe|stack)\b|\bf_back\b|\bf_locals\b|"
                            r"\b(?:sys|threading)\.set(?:trace|profile)\b|\bgc\.get_referrers\b",
    "network": r"\bsocket\b|\burllib\.request\b|\bhttp\.client\b|\burlopen\b|\brequests\.(?:get|post)\b",
    "report files": r"outcomes\.jsonl|\bjunit|/report\b",
    "fake test output": r"\bPASSED\b|::test_",
}


@dataclass
class Screened:
    kept: dict[str, bytes | None] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)  # path -> why
    suspicious: list[str] = field(default_factory=list)


def is_test_path(path: str) -> bool:
    parts = path.split("/")
    name = parts[-1]
    return (any(p in TEST_DIRS for p in parts[:-1]) or name.startswith("test_") or name.endswith("_test.py")
            or name in ("test.py", "tests.py"))


def _pytest_section(path: str, data: bytes | None) -> object:
    """The pytest configuration a setup.cfg or pyproject.toml holds (None: none, or unreadable)."""
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    try:
        if path.endswith(".toml"):
            return tomllib.loads(text).get("tool", {}).get("pytest")
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(text)
        return {s: dict(parser[s]) for s in parser.sections() if s in ("tool:pytest", "pytest")} or None
    except (tomllib.TOMLDecodeError, configparser.Error):
        return "unreadable"


def _mentions(text: str) -> dict[str, int]:
    return {name: len(re.findall(pattern, text, re.MULTILINE)) for name, pattern in INTERNALS.items()}


def screen(task: RepoTask, changes: dict[str, bytes | None], snapshot: Path) -> Screened:
    out = Screened()
    named_tests = set(task.test_files())

    def drop(path: str, why: str, suspicious: bool = True) -> None:
        out.dropped[path] = why
        if suspicious:
            out.suspicious.append(f"{why}: {path}")

    for path, data in changes.items():
        parts = path.split("/")
        base = snapshot / path
        existed = base.is_file() or base.is_symlink()
        if ".git" in parts:
            drop(path, "git internals")
        elif "__pycache__" in parts or path.endswith((".pyc", ".pyo")):
            drop(path, "bytecode")
        elif data is not None and data.startswith(b"symlink:"):
            drop(path, "symbolic link")
        elif path in named_tests:
            drop(path, "edited the task's tests")
        elif parts[-1] in CONFIG_NAMES or path.endswith(".pth"):
            drop(path, "test configuration")
        elif is_test_path(path):
            drop(path, "edited tests" if existed else "added a test file", suspicious=existed or data is None)
        elif parts[-1] in ("setup.cfg", "pyproject.toml") and (
                _pytest_section(path, data) != _pytest_section(path, base.read_bytes() if existed else None)):
            drop(path, "test configuration")
        else:
            out.kept[path] = data
            if data is not None and path.endswith(".py"):
                before = _mentions(base.read_text(errors="replace")) if existed else {}
                grew = [n for n, c in _mentions(data.decode("utf-8", errors="replace")).items()
                        if c > before.get(n, 0)]
                if grew:
                    out.suspicious.append(f"{', '.join(grew)} in {path}")
    return out
