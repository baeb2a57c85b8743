"""Running a repository's pytest suite (or a selection of it) in the sandbox, over a workspace.

The tree is the workspace's overlay at ``/repo``; the execution environment is mounted read-only; outcomes come
from ``report_plugin`` through a folder outside the tree (``/report``). Bytecode is never written (``-B``); the
grader drops every ``.pyc`` and ``__pycache__`` change before a grading run (``screening``), so a planted one
never runs there, while the installed packages' own bytecode is used (a private ``pycache_prefix`` would make
every run compile pytest and the standard library anew: 0.8 s of a 1.4 s run). A test's outcome is the worst of
its phases: an error in setup or teardown fails it.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from codemill.repos.cache import PLUGIN
from codemill.repos.workspace import MOUNT_POINT, Workspace
from codemill.sandbox.limits import Limits
from codemill.sandbox.runner import ExecResult, Sandbox, _interpreter_dirs

REPORT_DIR = "/report"
ENV_MOUNT = "/env"  # the execution environment, read-only
SEVERITY = {"passed": 0, "xfailed": 1, "skipped": 2, "deselected": 3, "xpassed": 4, "failed": 5, "error": 6}


def repo_limits(wall_s: float = 300.0) -> Limits:
    """What a test run may use: a real suite needs more than a HumanEval check (memory, processes, files)."""
    return Limits(wall_s=wall_s, cpu_s=int(wall_s) + 5, memory_bytes=8 << 30, file_bytes=256 << 20,
                  open_files=1024, processes=256, tmpfs_bytes=512 << 20)


@dataclass
class TestRun:
    """What one run found: each test id's outcome and failure message, collection errors, the run's end."""

    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    collect_errors: dict[str, str] = field(default_factory=dict)
    finished: bool = False  # the session-end record was written
    exit: ExecResult | None = None

    def passed(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o == "passed"}

    def failed(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o in ("failed", "error")}


def parse_outcomes(text: str) -> TestRun:
    run = TestRun()
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        tid, when, outcome = str(rec.get("id", "")), rec.get("when"), str(rec.get("outcome", ""))
        if when == "session":
            run.finished = True
            continue
        if when == "collect" and outcome == "error":
            run.collect_errors[tid] = str(rec.get("message", ""))
            continue
        if outcome == "failed" and when in ("setup", "teardown"):
            outcome = "error"
        if outcome not in SEVERITY:
            continue
        if SEVERITY[outcome] >= SEVERITY.get(run.outcomes.get(tid, "passed"), 0) or tid not in run.outcomes:
            run.outcomes[tid] = outcome
            if rec.get("message"):
                run.messages[tid] = str(rec["message"])
    return run


def pytest_argv(selection: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
    """The command that runs ``selection`` (test ids; empty: the whole suite) in ``/repo``."""
    # -s -P, not -I: -I ignores every PYTHON* variable, PYTHONHASHSEED too, and a suite whose test ids come from
    # iterating a set of strings gets other ids on every run. The sandbox's environment is ours alone (bwrap
    # --clearenv), so honouring it lets in nothing of the agent's.
    args = [*_fixed_addresses(), f"{ENV_MOUNT}/bin/python", "-s", "-P", "-B", "-m", "pytest", "-p", PLUGIN,
            "-p", "no:cacheprovider", "-q", "--no-header", "-rN", "--continue-on-collection-errors", "--rootdir",
            MOUNT_POINT, *extra]
    if selection:
        args.append(f"@{REPORT_DIR}/selection.txt")
    return args


@functools.lru_cache(maxsize=1)
def _fixed_addresses() -> tuple[str, ...]:
    """``setarch -R``: the run without address-space randomisation, when util-linux's ``setarch`` is installed
    under ``/usr`` (the sandbox sees it there). Objects hashed by address (``None``, plain instances) then hash
    alike on every run, and so do the test ids a suite builds by iterating a set of them (isodate's do): without
    it, ids differ between runs and a task graded by id cannot be validated."""
    found = shutil.which("setarch")
    real = os.path.realpath(found) if found else ""
    return ("setarch", platform.machine(), "-R") if real.startswith("/usr/") else ()


def run_pytest(ws: Workspace, env: Path, sandbox: Sandbox, selection: Sequence[str] = (),
               extra: Sequence[str] = (), output_budget: int | None = None) -> TestRun:
    """Run the tests in the sandbox over ``ws`` and read what the plugin recorded."""
    report = Path(tempfile.mkdtemp(prefix="report-", dir=ws.root))
    try:
        report.chmod(0o777)
        if selection:
            (report / "selection.txt").write_text("\n".join(selection) + "\n")
        mounts = (*env_mounts(env), *ws.mounts(), "--bind", str(report), REPORT_DIR)
        result = sandbox.execute(pytest_argv(selection, extra), mounts=mounts, chdir=MOUNT_POINT,
                                 env={"PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"}, output_budget=output_budget)
        run = parse_outcomes(_read_report(report / "outcomes.jsonl"))
        run.exit = result
        return run
    finally:
        shutil.rmtree(report, ignore_errors=True)


def _read_report(path: Path, limit: int = 64 << 20) -> str:
    """The plugin's records: a regular file only (the tests' code could replace it with a link to anything),
    opened without following links, at most ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return ""
        return fh.read(limit).decode("utf-8", errors="replace")


def env_mounts(env: Path) -> tuple[str, ...]:
    """The mounts every command over a repository needs besides its tree: the interpreter, a private
    ``/dev/shm`` (multiprocessing) and the execution environment at ``/env``."""
    return (*interpreter_mounts(), "--perms", "1777", "--tmpfs", "/dev/shm", "--ro-bind", str(env), ENV_MOUNT)


def interpreter_mounts() -> tuple[str, ...]:
    """The interpreter's folders bound again over the sandbox's private ``/work`` and ``/tmp`` (the environments
    link the installed packages there), and their parent folders opened to the sandbox uid (bwrap creates them
    as root-only when the interpreter lives under ``/root``)."""
    args: list[str] = []
    dirs = _interpreter_dirs()
    for d in dirs:
        args += ["--ro-bind", d, d]
    parents = {str(p) for d in dirs for p in Path(d).parents}
    for parent in sorted(parents - {"/", "/tmp", "/work"}):
        if not any(parent == d or parent.startswith(d + "/") for d in dirs):
            args += ["--chmod", "0755", parent]
    return tuple(args)


def repo_sandbox(wall_s: float = 300.0) -> Sandbox:
    return Sandbox(repo_limits(wall_s), overlay=True)
