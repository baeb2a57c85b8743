"""The grader: a repository task's verdict on an agent's changes, in a fresh copy, never in the agent's tree.

1. The agent's changes pass through ``screening.screen`` (tests restored, test configuration and git internals
   refused, suspicious edits named).
2. A fresh workspace over the task's snapshot gets the kept changes, then ``test_patch`` (applied once per task
   in its own workspace, by ``git apply`` in the sandbox), then two **controls**: tests under names drawn at
   grading time, one that must pass and one that must fail, alike in shape.
3. pytest runs the files of the task's FAIL_TO_PASS and PASS_TO_PASS tests and the controls' file in the sandbox;
   outcomes come from ``report_plugin`` outside the tree and are read by test id.
4. **Every expected id must be present and passed**: missing (a collection error, a deselection, a run cut
   short), skipped, xfailed, errored or failed all count as failed. If the must-fail control passed or the
   must-pass one did not, the run was tampered with: reward 0, suspicious.

Reward: 1 iff every FAIL_TO_PASS and PASS_TO_PASS test passed (resolved); with ``partial``, the share of
FAIL_TO_PASS tests passed when every PASS_TO_PASS one did. The environment's final reward and
``codemill repo-tasks grade`` are this code.
"""

from __future__ import annotations

import ast
import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from codemill.errors import one_line
from codemill.repos.git import GIT_SAFE
from codemill.repos.pytest_run import TestRun, run_pytest
from codemill.repos.screening import screen
from codemill.repos.task import RepoTask
from codemill.repos.workspace import MOUNT_POINT, Workspace, WorkspaceError, apply_changes
from codemill.sandbox.runner import Outcome, Sandbox

RESOLVED, UNRESOLVED, ERROR, EMPTY = "resolved", "unresolved", "error", "empty_patch"


class PatchError(ValueError):
    """A patch that does not apply to the snapshot (git's reason, one line)."""


@dataclass
class Grade:
    instance_id: str
    status: str  # resolved | unresolved | error | empty_patch
    reward: float = 0.0
    tests: dict[str, str] = field(default_factory=dict)  # expected id -> outcome (passed, failed, missing, ...)
    reasons: list[str] = field(default_factory=list)  # why it is not resolved
    suspicious: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # agent's changes the grader did not apply, and why
    controls: str = ""  # ok | tampered: ...
    duration_s: float = 0.0

    @property
    def resolved(self) -> bool:
        return self.status == RESOLVED

    def record(self) -> dict:
        return asdict(self)


def patch_changes(snapshot: Path, patch: str, sandbox: Sandbox, scratch: Path | None = None) -> dict[str, bytes | None]:
    """The file changes ``patch`` makes to ``snapshot`` (``git apply`` in the sandbox, in a throwaway
    workspace); PatchError with git's reason when it does not apply."""
    ws = Workspace.create(snapshot, scratch)
    try:
        res = sandbox.execute(["git", "apply", "--whitespace=nowarn", "--recount", "-"], stdin=patch.encode(),
                              mounts=ws.mounts(), chdir=MOUNT_POINT, env=GIT_SAFE)
        if res.outcome != Outcome.PASSED:
            raise PatchError(one_line(res.error or res.stdout or f"git apply exited {res.returncode}"))
        return {p: d for p, d in ws.changes().items() if not p.startswith(".git/")}
    finally:
        ws.remove()


class _TestPatchCache:
    """``test_patch`` applied once per (snapshot, patch): graders of the same task share it."""

    def __init__(self, size: int = 256) -> None:
        self._items: OrderedDict[tuple[str, str], dict[str, bytes | None]] = OrderedDict()
        self._lock = threading.Lock()
        self.size = size

    def get(self, snapshot: Path, patch: str, sandbox: Sandbox, scratch: Path | None) -> dict[str, bytes | None]:
        key = (str(snapshot), hashlib.sha256(patch.encode()).hexdigest())
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        changes = patch_changes(snapshot, patch, sandbox, scratch) if patch.strip() else {}
        with self._lock:
            self._items[key] = changes
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return changes


TEST_PATCHES = _TestPatchCache()


@dataclass(frozen=True)
class Controls:
    path: str
    must_pass: str
    must_fail: str
    source: bytes  # appended to the file at ``path``


SUFFIXES = ("basic", "edge", "empty", "large", "negative", "repeat", "roundtrip", "unicode", "default", "nested")


def _test_names(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and n.name.startswith("test")]


def draw_controls(task: RepoTask, current: str) -> Controls:
    """Two tests appended to the task's first test file (``current``: its text as graded), named like its own
    tests (``test_<a neighbour>_<word><digits>``), one true assertion and one false in the same shape: code that
    rewrites outcomes wholesale, or tells them apart by file or name, gives itself away."""
    path = (task.FAIL_TO_PASS or task.PASS_TO_PASS)[0].split("::", 1)[0]
    taken = set(_test_names(current))
    stems = sorted(taken) or ["test_case"]
    names: list[str] = []
    while len(names) < 2:
        name = (f"{stems[secrets.randbelow(len(stems))].split('[', 1)[0]}_"
                f"{SUFFIXES[secrets.randbelow(len(SUFFIXES))]}{secrets.randbelow(90) + 10}")
        if name not in taken and name not in names:
            names.append(name)
    a, b = names
    x, y, z, w = (secrets.randbelow(10_000) for _ in range(4))
    wrong = z + w + 1 + secrets.randbelow(9)
    bodies = {a: f"    assert {x} + {y} == {x + y}\n", b: f"    assert {z} + {w} == {wrong}\n"}
    order = [a, b] if secrets.randbelow(2) else [b, a]
    source = ("\n\n" + "".join(f"def {n}():\n{bodies[n]}\n\n" for n in order)).encode()
    return Controls(path, f"{path}::{a}", f"{path}::{b}", source)


def grade_changes(task: RepoTask, snapshot: Path, env: Path, changes: dict[str, bytes | None], sandbox: Sandbox,
                  *, partial: bool = False, scratch: Path | None = None) -> Grade:
    """The verdict on ``changes`` (an agent's file changes against ``snapshot``)."""
    t0 = time.monotonic()
    grade = Grade(task.instance_id, UNRESOLVED)
    screened = screen(task, changes, snapshot)
    grade.dropped, grade.suspicious = screened.dropped, list(screened.suspicious)
    try:
        tests = TEST_PATCHES.get(snapshot, task.test_patch, sandbox, scratch)
    except PatchError as e:
        grade.status, grade.reasons = ERROR, [f"the task's test_patch does not apply: {e}"]
        return grade
    if screened.disqualified:
        grade.reasons = [f"the change reaches into the test runner: {', '.join(screened.disqualified)}"]
        grade.controls = "not run"
        grade.duration_s = time.monotonic() - t0
        return grade
    ws = Workspace.create(snapshot, scratch)
    try:
        try:
            apply_changes(ws, screened.kept)
            apply_changes(ws, tests)
            first = (task.FAIL_TO_PASS or task.PASS_TO_PASS)[0].split("::", 1)[0]
            current = ws.read_bytes(first) if ws.exists(first) else b""
            controls = draw_controls(task, current.decode("utf-8", errors="replace"))
            apply_changes(ws, {controls.path: current + controls.source})
        except WorkspaceError as e:  # the agent's tree cannot take the task's files (a file where a folder was)
            grade.reasons = [f"the grading tree cannot be built from the change: {e}"]
            grade.controls = "not run"
            grade.duration_s = time.monotonic() - t0
            return grade
        # Whole files, not node ids: pytest aborts the run when one named id cannot be collected, where a file
        # with a collection error only loses its own tests (the outcomes of the rest are read by id).
        files = sorted({t.split("::", 1)[0] for t in task.expected_tests} | {controls.path})
        run = run_pytest(ws, env, sandbox, [f for f in files if ws.exists(f)])
    finally:
        ws.remove()
    _judge(task, run, controls, grade, partial)
    grade.duration_s = time.monotonic() - t0
    return grade


def grade_patch(task: RepoTask, snapshot: Path, env: Path, patch: str, sandbox: Sandbox, *,
                partial: bool = False, scratch: Path | None = None) -> Grade:
    """The verdict on a unified diff (a SWE-bench prediction's ``model_patch``)."""
    if not patch.strip():
        return Grade(task.instance_id, EMPTY, reasons=["empty patch"])
    try:
        changes = patch_changes(snapshot, patch, sandbox, scratch)
    except PatchError as e:
        return Grade(task.instance_id, ERROR, reasons=[f"patch does not apply: {e}"])
    return grade_changes(task, snapshot, env, changes, sandbox, partial=partial, scratch=scratch)


def _judge(task: RepoTask, run: TestRun, controls: Controls, grade: Grade, partial: bool) -> None:
    def outcome(test_id: str) -> str:
        return run.outcomes.get(test_id, "missing")

    grade.tests = {t: outcome(t) for t in task.expected_tests}
    for t, o in grade.tests.items():
        if o != "passed":
            kind = "FAIL_TO_PASS" if t in task.FAIL_TO_PASS else "PASS_TO_PASS"
            message = run.messages.get(t, "")
            grade.reasons.append(f"{kind} {t} {o}" + (f": {one_line(message, 200)}" if message else ""))
    if run.collect_errors:
        grade.reasons.append("collection errors: " + ", ".join(sorted(run.collect_errors))[:400])
    if run.exit is not None and run.exit.outcome == Outcome.TIMED_OUT:
        grade.reasons.append(f"the test run hit its wall clock ({run.exit.duration_s:.0f} s)")
    pass_ok, fail_ok = outcome(controls.must_pass) == "passed", outcome(controls.must_fail) == "failed"
    if pass_ok and fail_ok:
        grade.controls = "ok"
    else:
        said = [f"must-pass control {outcome(controls.must_pass)}"] if not pass_ok else []
        said += [f"must-fail control {outcome(controls.must_fail)}"] if not fail_ok else []
        # A run that never finished (a timeout, a crash), or a controls' file that did not collect (the change
        # broke an import the file needs), loses its controls too: a failure, not a forgery.
        lost = controls.path in run.collect_errors and not pass_ok and outcome(controls.must_fail) == "missing"
        finished = (run.finished and not lost) or outcome(controls.must_fail) == "passed"
        grade.controls = ("tampered: " if finished else "incomplete: ") + ", ".join(said)
        if finished:
            grade.suspicious.append("controls: " + ", ".join(said))
        grade.reasons.append(grade.controls)
    if not run.finished and grade.controls == "ok":
        grade.controls = "incomplete: the test run did not finish"
        grade.reasons.append(grade.controls)
    f2p = [grade.tests[t] == "passed" for t in task.FAIL_TO_PASS]
    p2p_ok = all(grade.tests[t] == "passed" for t in task.PASS_TO_PASS)
    if grade.controls != "ok":
        grade.status, grade.reward = UNRESOLVED, 0.0
    elif all(f2p) and p2p_ok:
        grade.status, grade.reward = RESOLVED, 1.0
    else:
        grade.status = UNRESOLVED
        grade.reward = (sum(f2p) / len(f2p)) if (partial and p2p_ok and f2p) else 0.0
