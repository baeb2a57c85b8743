"""Repository tasks by bug injection (the SWE-smith method), from any git repository with a pytest suite.

1. **Admission**: the suite runs twice at the commit in the sandbox; tests whose outcome differs between the runs
   are flaky and left out, and so are ids that only one run has (named after something that changes per run);
   the repository is admitted when at least ``min_pass_rate`` of its tests pass.
2. **Mutation**: ``mutate`` rewrites one function of one source file at a time (a sample per operator).
3. **Keep**: the suite runs on each mutant; a mutant is kept when at least one passing test fails
   (FAIL_TO_PASS) and at least one still passes (PASS_TO_PASS).
4. **Task**: in a task repository (``<tasks root>/<name>``, a bare repository holding the source commit) the base
   commit is the mutant with the FAIL_TO_PASS tests removed from their files (hidden from the agent);
   ``test_patch`` restores them; ``patch`` (the gold fix) is the inverse of the mutation. The problem statement
   is written from the failing tests' names and messages, never from the diff.
5. **Validation**: the grader (``grading``) must resolve the gold patch in ``validation_runs`` of
   ``validation_runs`` runs and must not resolve an empty change; anything else drops the task.

``SynthesisReport`` counts mutants tried, kept and validated per operator, and why the rest were dropped.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from codemill.repos import git
from codemill.repos.cache import RepoCache
from codemill.repos.grading import grade_changes, grade_patch
from codemill.repos.mutate import Mutation, mutations, sample
from codemill.repos.pytest_run import TestRun, repo_sandbox, run_pytest
from codemill.repos.screening import is_test_path
from codemill.repos.task import RepoTask
from codemill.repos.workspace import Workspace, apply_changes
from codemill.sandbox.runner import Sandbox

SKIP_FILES = ("setup.py", "conftest.py", "noxfile.py", "docs/", "doc/", "examples/", "benchmarks/")


@dataclass
class Admission:
    repo: str
    admitted: bool
    reason: str = ""
    tests: int = 0
    passing: list[str] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)
    suite_s: float = 0.0
    unstable: list[str] = field(default_factory=list)  # ids that differ between two runs of the same suite

    @property
    def pass_rate(self) -> float:
        return len(self.passing) / self.tests if self.tests else 0.0


@dataclass
class SynthesisReport:
    admission: Admission
    tried: Counter = field(default_factory=Counter)  # per operator
    kept: Counter = field(default_factory=Counter)  # mutants with FAIL_TO_PASS and PASS_TO_PASS
    validated: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)  # why
    tasks: list[RepoTask] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict:
        a = self.admission
        return {"repo": a.repo, "admitted": a.admitted, "reason": a.reason, "tests": a.tests,
                "pass_rate": round(a.pass_rate, 4), "flaky": len(a.flaky), "unstable_ids": len(a.unstable),
                "suite_s": round(a.suite_s, 2),
                "tried": dict(self.tried), "kept": dict(self.kept), "validated": dict(self.validated),
                "dropped": dict(self.dropped), "tasks": len(self.tasks), "wall_s": round(self.wall_s, 1)}


def admit(name: str, snapshot: Path, env: Path, sandbox: Sandbox, min_pass_rate: float, scratch: Path) -> Admission:
    runs: list[TestRun] = []
    t0 = time.monotonic()
    for _ in range(2):
        ws = Workspace.create(snapshot, scratch)
        try:
            runs.append(run_pytest(ws, env, sandbox))
        finally:
            ws.remove()
    suite_s = (time.monotonic() - t0) / 2
    first, second = runs
    if not first.finished or not first.outcomes:
        said = first.exit.error if first.exit else ""
        return Admission(name, False, f"the suite does not run: {said or 'no test ran'}", suite_s=suite_s)
    # An id in one run only (a parametrisation named after an object's address) names no stable test.
    ids = sorted(set(first.outcomes) & set(second.outcomes))
    unstable = sorted(set(first.outcomes) ^ set(second.outcomes))
    flaky = [t for t in ids if first.outcomes[t] != second.outcomes[t]]
    passing = [t for t in ids if t not in flaky and first.outcomes[t] == "passed"]
    adm = Admission(name, True, "", len(ids), passing, flaky, suite_s, unstable)
    if adm.pass_rate < min_pass_rate:
        adm.admitted = False
        adm.reason = f"{adm.pass_rate:.0%} of {adm.tests} tests pass (needs {min_pass_rate:.0%})"
    return adm


def source_files(snapshot: Path) -> list[str]:
    """The repository's Python files that are code under test (not tests, setup, docs or examples)."""
    out = []
    for p in sorted(snapshot.rglob("*.py")):
        rel = str(p.relative_to(snapshot))
        if rel.startswith(".git/") or is_test_path(rel) or rel.startswith(SKIP_FILES) or rel.endswith(SKIP_FILES):
            continue
        out.append(rel)
    return out


def defined_tests(source: str) -> set[str]:
    """The qualified names (``func``, ``Class.method``) of the functions a test file defines."""
    out: set[str] = set()

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out.add(prefix + node.name)
            elif isinstance(node, ast.ClassDef):
                walk(node.body, prefix + node.name + ".")

    with contextlib.suppress(SyntaxError):
        walk(ast.parse(source).body, "")
    return out


def hidden_files(snapshot: Path, test_ids: list[str]) -> dict[str, bytes] | None:
    """The test files with the functions behind ``test_ids`` removed. A test a class inherits (unittest mixins)
    is removed where it is defined, when exactly one test file's class defines it. None when one cannot be
    found."""
    defined = {rel: defined_tests((snapshot / rel).read_text(errors="replace"))
               for rel in (str(p.relative_to(snapshot)) for p in sorted(snapshot.rglob("*.py")))
               if is_test_path(rel) and not rel.startswith(".git/")}
    targets: dict[str, set[str]] = {}
    for tid in test_ids:
        path, *parts = tid.split("::")
        qual = ".".join(p.split("[", 1)[0] for p in parts)
        if qual in defined.get(path, set()):
            targets.setdefault(path, set()).add(qual)
            continue
        owner = _inherited_from(snapshot, path, qual, defined)
        if owner is None:
            return None
        targets.setdefault(owner[0], set()).add(owner[1])
    out: dict[str, bytes] = {}
    for path, quals in sorted(targets.items()):
        text = hide_functions((snapshot / path).read_text(), sorted(quals))
        if text is None:
            return None
        out[path] = text.encode()
    return out


def _bases(source: str, cls: str) -> list[str]:
    """The names of the base classes of class ``cls`` (a qualified name) in ``source``."""
    scope: list[ast.stmt] = ast.parse(source).body
    node: ast.ClassDef | None = None
    for part in cls.split("."):
        node = next((n for n in scope if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            return []
        scope = node.body
    assert node is not None
    return [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, ast.Name | ast.Attribute)]


def _inherited_from(snapshot: Path, path: str, qual: str, defined: dict[str, set[str]]) -> tuple[str, str] | None:
    """Where the method behind test ``qual`` (``Class.method``) of ``path`` is defined when its class inherits it:
    the first base class (breadth first) that defines it, in the same file first, else in exactly one test file."""
    if "." not in qual:
        return None
    cls, method = qual.rsplit(".", 1)
    queue = [(path, cls)]
    seen: set[tuple[str, str]] = set()
    while queue:
        file, name = queue.pop(0)
        if (file, name) in seen or len(seen) > 20:
            continue
        seen.add((file, name))
        for base in _bases((snapshot / file).read_text(errors="replace"), name):
            if f"{base}.{method}" in defined.get(file, set()):
                return file, f"{base}.{method}"
            owners = [f for f, names in defined.items() if f"{base}.{method}" in names]
            if len(owners) == 1:
                return owners[0], f"{base}.{method}"
            queue += [(f, base) for f, names in defined.items() if any(q.startswith(base + ".") for q in names)]
    return None


def hide_functions(source: str, qualnames: list[str]) -> str | None:
    """``source`` without the functions ``qualnames`` names (``func``, ``Class.method``), decorators included; a
    class left empty keeps a ``pass``. None when one is not in the file."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    spans: set[tuple[int, int, int]] = set()  # (first line, last line, indent of a class body left empty)
    for qual in qualnames:
        scope: list[ast.stmt] = tree.body
        node = None
        parts = qual.split(".")
        for depth, part in enumerate(parts):
            node = next((n for n in scope if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                         and n.name == part), None)
            if node is None:
                return None
            if depth < len(parts) - 1:
                scope = node.body
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return None
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        spans.add((first, node.end_lineno or node.lineno, node.col_offset))
    for first, last, indent in sorted(spans, reverse=True):
        del lines[first - 1:last]
        lines.insert(first - 1, " " * indent + "pass\n" if indent else "")
    out = "".join(lines)
    try:
        ast.parse(out)
    except SyntaxError:
        return None
    return out


def problem_statement(f2p: list[str], run: TestRun, limit: int = 8) -> str:
    """What is broken, in the words of the failing tests (names and messages), never of the diff."""
    lines = [f"{len(f2p)} test{'s' if len(f2p) > 1 else ''} of this repository fail:"]
    for tid in f2p[:limit]:
        path, _, name = tid.partition("::")
        message = " ".join(run.messages.get(tid, "").split())[:300]
        lines.append(f"- {name.replace('::', '.')} ({path})" + (f": {message}" if message else ""))
    if len(f2p) > limit:
        lines.append(f"- and {len(f2p) - limit} more")
    lines.append("Find the bug in the code and fix it, so that these tests pass without breaking the others.")
    return "\n".join(lines)


@dataclass
class Synthesizer:
    """Makes the tasks of one repository (``synthesize``)."""

    cache: RepoCache
    tasks_root: Path
    per_operator: int = 4
    seed: int = 0
    min_pass_rate: float = 0.8
    validation_runs: int = 3
    wall_s: float = 120.0
    workers: int = 2
    on_progress: Callable[[str], None] | None = None
    requirements: tuple[str, ...] = ()

    def synthesize(self, name: str, repo: Path, commit: str = "HEAD",
                   requirements: Sequence[str] = ()) -> SynthesisReport:
        t0 = time.monotonic()
        sandbox = repo_sandbox(self.wall_s)
        scratch = self.cache.root / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        commit = git.resolve_commit(repo, commit)
        snapshot = self.cache.snapshot(repo, commit)
        requirements = tuple(requirements) or self.requirements
        env = self.cache.env(snapshot, requirements)
        report = SynthesisReport(admit(name, snapshot, env, sandbox, self.min_pass_rate, scratch))
        if not report.admission.admitted:
            report.wall_s = time.monotonic() - t0
            return report
        task_repo = self._task_repo(name, repo, commit)
        candidates = [m for path in source_files(snapshot)
                      for m in mutations(path, (snapshot / path).read_text(errors="replace"))]
        chosen = sample(candidates, self.per_operator, self.seed)
        report.tried.update(m.operator for m in chosen)

        def attempt(m: Mutation) -> RepoTask | str:
            return self._attempt(name, m, snapshot, env, sandbox, scratch, task_repo, commit, report.admission,
                                 requirements)

        with ThreadPoolExecutor(max(1, self.workers)) as pool:
            for m, outcome in zip(chosen, pool.map(attempt, chosen), strict=True):
                if isinstance(outcome, str):
                    report.dropped[outcome] += 1
                    if outcome not in ("no test fails", "no test passes", "mutant run did not finish"):
                        report.kept[m.operator] += 1  # kept as a mutant, lost in task building or validation
                    continue
                report.kept[m.operator] += 1
                report.validated[m.operator] += 1
                report.tasks.append(outcome)
                if self.on_progress:
                    self.on_progress(f"{outcome.instance_id}: validated")
        report.wall_s = time.monotonic() - t0
        return report

    def _task_repo(self, name: str, repo: Path, commit: str) -> Path:
        """The bare repository the tasks' commits live in, holding the source commit (fetched locally)."""
        path = self.tasks_root / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            git.git(path.parent, "init", "-q", "--bare", path.name)
        git.git(path, "fetch", "-q", "--no-tags", str(Path(repo).resolve()), commit)
        git.git(path, "update-ref", f"refs/codemill/{commit}", commit)
        return path

    def _attempt(self, name: str, m: Mutation, snapshot: Path, env: Path, sandbox: Sandbox, scratch: Path,
                 task_repo: Path, commit: str, adm: Admission, requirements: tuple[str, ...]) -> RepoTask | str:
        ws = Workspace.create(snapshot, scratch)
        try:
            apply_changes(ws, {m.path: m.source.encode()})
            run = run_pytest(ws, env, sandbox)
        finally:
            ws.remove()
        if not run.finished:
            return "mutant run did not finish"  # cut by the wall clock or killed: its missing tests say nothing
        passing = set(adm.passing)
        f2p = sorted(t for t in passing if run.outcomes.get(t) in ("failed", "error"))
        p2p = sorted(t for t in passing if run.outcomes.get(t) == "passed")
        if not f2p:
            return "no test fails"
        if not p2p:
            return "no test passes"
        hidden = hidden_files(snapshot, f2p)
        if hidden is None:
            return "failing tests cannot be hidden"
        # PASS_TO_PASS: the passing tests still present at the base commit (a hidden function's other
        # parametrisations come back with test_patch, and are graded as PASS_TO_PASS too).
        changes: dict[str, bytes | None] = {m.path: m.source.encode(), **hidden}
        base = git.commit_files(task_repo, commit, changes, f"bug: {m.label}")
        patch = git.git(task_repo, "diff", base, commit, "--", m.path)
        test_patch = git.git(task_repo, "diff", base, commit, "--", *sorted(hidden))
        digest = hashlib.sha256(f"{commit}:{m.label}:{m.source}".encode()).hexdigest()[:10]
        task = RepoTask(f"{name}__{m.operator}-{digest}", name, base, problem_statement(f2p, run), patch,
                        test_patch, tuple(f2p), tuple(p2p), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "synthesis", "", m.label)
        return validate(task, self.cache, task_repo, sandbox, scratch, self.validation_runs, requirements)


def validate(task: RepoTask, cache: RepoCache, repo: Path, sandbox: Sandbox, scratch: Path | None, runs: int,
             requirements: Sequence[str] = ()) -> RepoTask | str:
    """The task with its validation record when the grader resolves its gold patch in ``runs`` of ``runs`` runs
    and does not resolve an empty change; otherwise why not (a named outcome the yield report counts)."""
    snapshot = cache.snapshot(repo, task.base_commit)
    env = cache.env(snapshot, requirements)
    gold = [grade_patch(task, snapshot, env, task.patch, sandbox, scratch=scratch) for _ in range(runs)]
    if any(g.status == "error" for g in gold):
        return "gold patch does not apply"
    if not all(g.resolved for g in gold):
        return "gold patch fails"
    empty = grade_changes(task, snapshot, env, {}, sandbox, scratch=scratch)
    if empty.resolved:
        return "resolved without a change"
    record = {"gold": [g.status for g in gold], "empty": empty.status,
              "gold_s": [round(g.duration_s, 2) for g in gold]}
    return RepoTask(**{**task.__dict__, "validation": json.dumps(record)})
