"""Repository environments (``codemill.repos``) against the plain ways of doing the same work, on real tasks.

Tasks: the first ``--per-repo`` tasks of each repository in ``--tasks`` (SWE-bench format), their snapshots and
execution environments from the default ``RepoCache`` (built before anything is timed). Everything runs in one
process, the two sides interleaved call by call (or task by task), so drift in machine load hits both alike.

1. **Reset**, ``--resets`` per repository on its first task's snapshot, after one unmeasured warm-up: a fresh tree
   and its removal. codemill: ``Workspace.create`` + ``remove`` (an overlay layer: two empty folders).
   References: ``cp -r`` of the snapshot (with its ``.git``) + ``rm -rf``, and ``git worktree add --detach`` +
   ``git worktree remove --force`` from a private copy of the snapshot repository (the shared snapshot is never
   written). "+ first command" adds one ``true`` that sees the tree: codemill ``RepoTools.bash`` (bubblewrap
   mounting the overlay), the references ``bash -c true`` run in the tree (no sandbox). p50/p99 over all
   repositories.
2. **Tool calls**, ``--calls`` per repository in one workspace against one ``cp -r`` copy: ``bash`` with
   ``true`` (vs ``subprocess.run(["bash", "-c", "true"])`` in the copy), ``read_file`` of the first file the gold
   patch changes (vs ``open().read()``), ``edit`` with the gold patch's first hunk, applied and reverted in turn
   (vs read / ``str.replace`` / write). All through ``RepoTools.run``, the agent's entry. A bare sandbox running
   ``/bin/true`` (no tree, no environment) is printed to show what of ``bash`` is the sandbox's own start.
3. **Grading**, ``--rounds`` times per task: codemill ``grade_patch`` of the gold patch (patch applied in a
   sandboxed workspace, screening, ``test_patch``, controls, pytest in the sandbox) vs grading in the working
   tree: ``cp -r`` the snapshot, ``git apply`` the gold patch and ``test_patch``, run
   ``python -m pytest <the expected tests' files> -q -p no:cacheprovider -rp`` there with this interpreter and no
   sandbox, ``rm -rf``. codemill applies ``test_patch`` once per task (``grading.TEST_PATCHES``), so its first
   grade of a task and its later ones are shown apart. Accuracy: both must find every expected test passed
   (the reference reads pytest's ``PASSED <id>`` summary lines).
4. **Oracle episodes**: ``play(oracle, RepoEpisode(...))`` then ``grade()`` on every task, ``--rounds`` times,
   one at a time and two at once (a thread pool of 2), interleaved by round: episodes per minute and the share
   resolved (must be all).
5. **Disk per episode**: the oracle's ``ws.disk_bytes()`` before ``close()`` against a ``cp -r`` copy of the
   snapshot and the files the gold patch changes (sums of regular files' sizes, like ``disk_bytes``).

    python -m benchmarks.repo_env [--tasks F] [--repos D] [--per-repo 3] [--rounds 2] [--resets 50] [--calls 50]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import stat
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codemill.cpus import usable_cpus
from codemill.repos.agents import hunks, oracle, play
from codemill.repos.cache import SOURCE_ROOTS, RepoCache, python_of
from codemill.repos.episode import RepoEpisode
from codemill.repos.grading import grade_patch
from codemill.repos.pytest_run import repo_sandbox
from codemill.repos.task import RepoTask, patch_paths, read_tasks
from codemill.repos.tools import RepoTools
from codemill.repos.workspace import Workspace
from codemill.sandbox import binary
from codemill.sandbox.runner import Sandbox

RESET_GOAL_MS = 50.0
TOOL_OVERHEAD_GOAL_MS = 15.0


# --- measuring and printing ----------------------------------------------------------------------------
def seconds(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 200 samples is the second largest: no interpolation past the data)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def ms(x: float) -> str:
    return f"{x * 1e3:9.2f}"


def print_table(title: str, rows: dict[str, dict[str, list[float]]], columns: Sequence[str],
                ratios: Sequence[tuple[str, str]]) -> None:
    """``rows[label][column]`` samples in seconds, shown as p50 and p99 in ms; then p50 ratios ``a / b``."""
    print(f"\n{title}")
    width = max(len(label) for label in rows) + 2
    print(f"{'':<{width}}" + "".join(f"{c + ' p50':>20}{'p99':>9}" for c in columns) + f"{'n':>6}")
    for label, cols in rows.items():
        cells = "".join(f"{ms(pct(cols[c], 0.5)):>20}{ms(pct(cols[c], 0.99))}" if cols.get(c) else f"{'-':>29}"
                        for c in columns)
        n = max(len(v) for v in cols.values())
        print(f"{label:<{width}}{cells}{n:>6}")
    for a, b in ratios:
        said = ", ".join(f"{c} {pct(rows[a][c], 0.5) / pct(rows[b][c], 0.5):.2f}x" for c in columns
                         if rows[a].get(c) and rows[b].get(c))
        print(f"  p50 ratio {a} / {b}: {said}")


def run(argv: list[str], cwd: Path | None = None, stdin: bytes | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, input=stdin, env=env, capture_output=True, check=True)


def tree_bytes(root: Path) -> int:
    """Sum of the regular files' sizes under ``root`` (what ``Workspace.disk_bytes`` counts for its layer)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def scratch_dir(parent: Path, name: str) -> Path:
    """A fresh, not yet existing path under ``parent`` (for ``cp -r`` and ``git worktree add`` to create)."""
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=parent)) / "tree"


# --- the tasks -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prepared:
    task: RepoTask
    snapshot: Path
    env: Path


def select(tasks: list[RepoTask], per_repo: int) -> list[RepoTask]:
    """The first ``per_repo`` tasks of each repository, in file order (the same selection every run)."""
    taken: dict[str, list[RepoTask]] = {}
    for t in tasks:
        if len(taken.setdefault(t.repo, [])) < per_repo:
            taken[t.repo].append(t)
    return [t for repo in sorted(taken) for t in taken[repo]]


def first_per_repo(prepared: list[Prepared]) -> list[Prepared]:
    seen: dict[str, Prepared] = {}
    for p in prepared:
        seen.setdefault(p.task.repo, p)
    return list(seen.values())


# --- 1. reset --------------------------------------------------------------------------------------------
class Reset:
    """One way to give an episode a fresh tree: ``make`` returns it ready, ``command`` runs ``true`` in it,
    ``drop`` removes it."""

    def make(self) -> Any:
        raise NotImplementedError

    def command(self, tree: Any) -> None:
        run(["bash", "-c", "true"], cwd=tree)

    def drop(self, tree: Any) -> None:
        raise NotImplementedError


class OverlayReset(Reset):
    def __init__(self, p: Prepared, sandbox: Sandbox, scratch: Path) -> None:
        self.p, self.sandbox, self.scratch = p, sandbox, scratch

    def make(self) -> Workspace:
        return Workspace.create(self.p.snapshot, self.scratch)

    def command(self, tree: Workspace) -> None:
        RepoTools(tree, self.p.env, self.sandbox).bash("true")

    def drop(self, tree: Workspace) -> None:
        tree.remove()


class CopyReset(Reset):
    def __init__(self, snapshot: Path, scratch: Path) -> None:
        self.snapshot, self.scratch = snapshot, scratch

    def make(self) -> Path:
        dest = scratch_dir(self.scratch, "cp")
        run(["cp", "-r", str(self.snapshot), str(dest)])
        return dest

    def drop(self, tree: Path) -> None:
        run(["rm", "-rf", str(tree.parent)])


class WorktreeReset(Reset):
    """Worktrees of a private copy of the snapshot repository: ``worktree add`` writes into the repository's
    ``.git``, and the cache's snapshots are shared read-only."""

    def __init__(self, snapshot: Path, scratch: Path) -> None:
        self.repo, self.scratch = scratch_dir(scratch, "wt-repo"), scratch
        run(["cp", "-r", str(snapshot), str(self.repo)])

    def make(self) -> Path:
        dest = scratch_dir(self.scratch, "wt")
        run(["git", "-C", str(self.repo), "worktree", "add", "-q", "--detach", str(dest), "HEAD"])
        return dest

    def drop(self, tree: Path) -> None:
        run(["git", "-C", str(self.repo), "worktree", "remove", "--force", str(tree)])
        tree.parent.rmdir()


def bench_resets(firsts: list[Prepared], sandbox: Sandbox, scratch: Path, n: int) -> None:
    rows: dict[str, dict[str, list[float]]] = {}
    for p in firsts:
        methods = {"codemill Workspace (overlay)": OverlayReset(p, sandbox, scratch),
                   "cp -r + rm -rf": CopyReset(p.snapshot, scratch),
                   "git worktree add/remove": WorktreeReset(p.snapshot, scratch)}
        for i in range(n + 1):  # the first round warms the page cache and is not kept
            for label, m in methods.items():
                reset = seconds(lambda m=m: m.drop(m.make()))
                tree = m.make()
                t0 = time.perf_counter()
                m.command(tree)
                first = time.perf_counter() - t0
                m.drop(tree)
                if i:
                    cols = rows.setdefault(label, {"reset": [], "reset+command": []})
                    cols["reset"].append(reset)
                    cols["reset+command"].append(reset + first)
    print_table(f"1. Episode reset: a fresh tree and its removal, ms ({n} per repository x {len(firsts)} "
                f"repositories; goal: reset p50 <= {RESET_GOAL_MS:.0f} ms)", rows, ("reset", "reset+command"),
                [("codemill Workspace (overlay)", "cp -r + rm -rf"),
                 ("codemill Workspace (overlay)", "git worktree add/remove")])


# --- 2. tool calls ---------------------------------------------------------------------------------------
def reversible_hunk(task: RepoTask, snapshot: Path) -> tuple[str, str, str] | None:
    """A hunk of the gold patch that ``edit`` can apply and revert: its old text once in the file, its new text
    not yet there."""
    for path, old, new in hunks(task.patch):
        f = snapshot / path
        if old and new and old != new and f.is_file():
            text = f.read_text(errors="replace")
            if text.count(old) == 1 and text.count(new) == 0:
                return path, old, new
    return None


def plain_edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if text.count(old) != 1:
        raise RuntimeError(f"{path}: the edit's old text is not there once")
    path.write_text(text.replace(old, new, 1))


def tool_calls(tools: RepoTools, copy: Path, path: str, edit: tuple[str, str] | None
               ) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Each measured tool: (codemill's call, the plain call doing the same work in the copy)."""
    pairs: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "bash": (lambda: tools.run("bash", {"command": "true"}), lambda: run(["bash", "-c", "true"], cwd=copy)),
        "read_file": (lambda: tools.run("read_file", {"path": path}), lambda: plain_read(copy / path))}
    if edit is not None:
        old, new = edit
        pairs["edit"] = (lambda: tools.run("edit", {"path": path, "old": old, "new": new}),
                         lambda: plain_edit(copy / path, old, new))
    return pairs


def plain_read(path: Path) -> str:
    with open(path) as fh:
        return fh.read()


def bench_tools(firsts: list[Prepared], sandbox: Sandbox, scratch: Path, n: int) -> None:
    ours, plain, bare = "codemill RepoTools", "plain (no sandbox, cp -r copy)", "bare sandbox: /bin/true, no tree"
    rows: dict[str, dict[str, list[float]]] = {ours: {}, plain: {}, bare: {}}
    bare_sandbox = Sandbox(sandbox.limits, overlay=True)
    for p in firsts:
        hunk = reversible_hunk(p.task, p.snapshot)
        if hunk is None:
            print(f"  {p.task.repo}: no hunk of {p.task.instance_id} can be applied and reverted; edit not measured")
        path = hunk[0] if hunk else patch_paths(p.task.patch)[0]
        ws = Workspace.create(p.snapshot, scratch)
        copier = CopyReset(p.snapshot, scratch)
        copy = copier.make()
        try:
            for i in range(n + 1):  # the first round is a warm-up
                edit = None if hunk is None else (hunk[1], hunk[2]) if i % 2 == 0 else (hunk[2], hunk[1])
                times = {tool: (seconds(a), seconds(b))
                         for tool, (a, b) in tool_calls(RepoTools(ws, p.env, sandbox), copy, path, edit).items()}
                sandbox_only = seconds(lambda: bare_sandbox.execute(["/bin/true"]))
                if not i:
                    continue
                for tool, (a, b) in times.items():
                    rows[ours].setdefault(tool, []).append(a)
                    rows[plain].setdefault(tool, []).append(b)
                rows[bare].setdefault("bash", []).append(sandbox_only)
        finally:
            ws.remove()
            copier.drop(copy)
    shown = ("bash", "read_file", "edit")
    print_table(f"2. Tool calls, ms ({n} per repository x {len(firsts)} repositories, one workspace each)", rows,
                shown, [(ours, plain), (ours, bare)])
    said = ", ".join(f"{t} {1e3 * (pct(rows[ours][t], 0.5) - pct(rows[plain][t], 0.5)):.2f} ms"
                     for t in shown if t in rows[ours])
    print(f"  p50 overhead over the plain call: {said} (goal <= {TOOL_OVERHEAD_GOAL_MS:.0f} ms)")


# --- 3. grading ------------------------------------------------------------------------------------------
def reference_grade(p: Prepared, scratch: Path) -> bool:
    """Grading in a working tree: a ``cp -r`` copy, both patches by ``git apply``, pytest run directly; True
    when every expected test id is among pytest's ``PASSED`` lines."""
    copy = CopyReset(p.snapshot, scratch)
    tree = copy.make()
    try:
        for patch in (p.task.patch, p.task.test_patch):
            run(["git", "apply", "--whitespace=nowarn", "-"], cwd=tree, stdin=patch.encode())
        files = sorted({t.split("::", 1)[0] for t in p.task.expected_tests})
        roots = [str(tree / r) for r in SOURCE_ROOTS if (tree / r).is_dir()]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(roots), "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run([python_of(p.env), "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-rp"],
                              cwd=tree, env=env, capture_output=True, text=True)
        passed = {line[len("PASSED "):].strip() for line in proc.stdout.splitlines() if line.startswith("PASSED ")}
        return all(t in passed for t in p.task.expected_tests)
    finally:
        copy.drop(tree)


def bench_grading(prepared: list[Prepared], sandbox: Sandbox, scratch: Path, rounds: int) -> None:
    first: list[float] = []
    later: list[float] = []
    ref: list[float] = []
    verdicts: list[tuple[str, str, bool]] = []  # (task, codemill's status and reasons, the reference's verdict)
    for r in range(rounds):
        for p in prepared:
            t0 = time.perf_counter()
            g = grade_patch(p.task, p.snapshot, p.env, p.task.patch, sandbox, scratch=scratch)
            (later if r else first).append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ok = reference_grade(p, scratch)
            ref.append(time.perf_counter() - t0)
            verdicts.append((p.task.instance_id, "resolved" if g.resolved else f"{g.status} {g.reasons[:2]}", ok))
    print(f"\n3. Grading the gold patch, s per task ({len(prepared)} tasks x {rounds} rounds)")
    print(f"{'':<48}{'mean':>8}{'p50':>8}{'n':>5}")
    rows = {"codemill grade_patch, first grade of a task": first,
            "codemill grade_patch, later grades (cached)": later, "reference: grading in the working tree": ref}
    for label, xs in rows.items():
        if xs:
            print(f"{label:<48}{statistics.mean(xs):>8.2f}{pct(xs, 0.5):>8.2f}{len(xs):>5}")
    for label, xs in list(rows.items())[:2]:
        if xs:
            print(f"  ratio {label.removeprefix('codemill grade_patch, ')} / reference: mean "
                  f"{statistics.mean(xs) / statistics.mean(ref):.2f}x, p50 {pct(xs, 0.5) / pct(ref, 0.5):.2f}x")
    ours = sum(status == "resolved" for _, status, _ in verdicts)
    theirs = sum(ok for _, _, ok in verdicts)
    mismatches = [v for v in verdicts if (v[1] == "resolved") != v[2]]
    print(f"  every expected test passed: codemill {ours}/{len(verdicts)}, reference {theirs}/{len(verdicts)}; "
          f"verdicts that differ: {len(mismatches)}")
    for iid, status, ok in verdicts:
        if status != "resolved" or not ok:
            print(f"  {iid}: codemill {status}; reference {'all passed' if ok else 'not all passed'}")


# --- 4 and 5. oracle episodes -----------------------------------------------------------------------------
@dataclass(frozen=True)
class EpisodeResult:
    repo: str
    resolved: bool
    wall_s: float
    tool_s: float
    grade_s: float
    disk_bytes: int
    gold_bytes: int


def oracle_episode(p: Prepared, sandbox: Sandbox, scratch: Path) -> EpisodeResult:
    t0 = time.perf_counter()
    episode = RepoEpisode(p.task, p.snapshot, p.env, sandbox, scratch=scratch)
    try:
        play(oracle, episode)
        grade = episode.grade()
        ws = episode.ws
        disk = ws.disk_bytes()
        gold = sum(len(ws.read_bytes(f)) for f in patch_paths(p.task.patch) if ws.exists(f))
    finally:
        episode.close()
    return EpisodeResult(p.task.repo, grade.resolved, time.perf_counter() - t0, episode.stats.tool_s,
                         grade.duration_s, disk, gold)


def bench_episodes(prepared: list[Prepared], sandbox: Sandbox, scratch: Path, rounds: int) -> list[EpisodeResult]:
    walls: dict[int, list[float]] = {1: [], 2: []}
    results: dict[int, list[EpisodeResult]] = {1: [], 2: []}
    for _ in range(rounds):
        for width in (1, 2):
            t0 = time.perf_counter()
            with ThreadPoolExecutor(width) as pool:
                results[width] += pool.map(lambda p: oracle_episode(p, sandbox, scratch), prepared)
            walls[width].append(time.perf_counter() - t0)
    print(f"\n4. Oracle episodes (play + grade), {len(prepared)} tasks x {rounds} rounds")
    print(f"{'':<24}{'episodes/min':>13}{'resolved':>10}{'episode s':>10}{'tools s':>9}{'grade s':>9}")
    rate = {}
    for width, label in ((1, "one at a time"), (2, "two at once")):
        rs = results[width]
        rate[width] = len(rs) / sum(walls[width]) * 60
        print(f"{label:<24}{rate[width]:>13.1f}{sum(r.resolved for r in rs) / len(rs):>10.0%}"
              f"{statistics.mean(r.wall_s for r in rs):>10.2f}{statistics.mean(r.tool_s for r in rs):>9.2f}"
              f"{statistics.mean(r.grade_s for r in rs):>9.2f}")
    print(f"  two at once / one at a time: {rate[2] / rate[1]:.2f}x episodes/min "
          f"({usable_cpus()} usable cores); episode s = one episode's wall, tools s = its tool calls' summed time")
    return results[1]


def print_disk(results: list[EpisodeResult], prepared: list[Prepared]) -> None:
    copy = {p.task.repo: tree_bytes(p.snapshot) for p in first_per_repo(prepared)}
    by_repo: dict[str, list[EpisodeResult]] = {}
    for r in results:
        by_repo.setdefault(r.repo, []).append(r)
    print("\n5. Disk per oracle episode, bytes (mean over its episodes; goal: the changed files only)")
    print(f"{'repository':<18}{'workspace':>11}{'gold files':>12}{'cp -r copy':>12}{'ws / gold':>11}"
          f"{'ws / copy':>11}")
    for repo, rs in sorted(by_repo.items()):
        ws, gold = statistics.mean(r.disk_bytes for r in rs), statistics.mean(r.gold_bytes for r in rs)
        print(f"{repo:<18}{ws:>11.0f}{gold:>12.0f}{copy[repo]:>12}{ws / gold:>11.2f}{ws / copy[repo]:>11.4f}")
    print("  cp -r copy: the first task's snapshot with its .git (snapshots of one repository differ little)")


# --- the run ---------------------------------------------------------------------------------------------
def version_line(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def prepare(tasks: list[RepoTask], repos: Path) -> Iterator[Prepared]:
    """Snapshots and environments, built here on first use so that no timing includes them."""
    cache = RepoCache()
    for t in tasks:
        snapshot = cache.snapshot(repos / t.repo, t.base_commit)
        yield Prepared(t, snapshot, cache.env(snapshot))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=Path, default=Path("synth/tasks.jsonl"))
    ap.add_argument("--repos", type=Path, default=Path("synth/repos"),
                    help="the task repositories, one folder per task's repo")
    ap.add_argument("--per-repo", type=int, default=3, help="tasks per repository")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the tasks for grading and episodes")
    ap.add_argument("--resets", type=int, default=50, help="resets per repository")
    ap.add_argument("--calls", type=int, default=50, help="calls of each tool per repository")
    args = ap.parse_args()

    every = read_tasks(args.tasks)
    prepared = list(prepare(select(every, args.per_repo), args.repos))
    firsts = first_per_repo(prepared)
    sandbox = repo_sandbox()
    sandbox.probe()
    available = {r: sum(t.repo == r for t in every) for r in sorted({t.repo for t in every})}
    chosen = {r: sum(p.task.repo == r for p in prepared) for r in available}

    print("Repository environments: codemill.repos vs plain copies, worktrees and pytest in the working tree")
    bwrap = binary.resolve(overlay=True)
    commit = version_line(["git", "-C", str(Path(__file__).parents[1]), "rev-parse", "--short", "HEAD"])
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.platform()}, {usable_cpus()} usable cores; Python "
          f"{platform.python_version()}; {version_line(['git', '--version'])}; {bwrap.version} ({bwrap.origin}); "
          f"codemill {commit}")
    print(f"tasks from {args.tasks}: " + ", ".join(f"{r} {chosen[r]}/{available[r]}" for r in available)
          + f" (selected/available); rounds {args.rounds}, resets {args.resets}, calls {args.calls}")
    with tempfile.TemporaryDirectory(prefix="repo-env-bench-") as tmp:
        scratch = Path(tmp)
        bench_resets(firsts, sandbox, scratch, args.resets)
        bench_tools(firsts, sandbox, scratch, args.calls)
        bench_grading(prepared, sandbox, scratch, args.rounds)
        results = bench_episodes(prepared, sandbox, scratch, args.rounds)
        print_disk(results, prepared)
        left = [p.name for p in scratch.iterdir() if not p.name.startswith("wt-repo-")]
        if left:
            print(f"\nleft behind in the scratch folder: {len(left)} entries ({', '.join(sorted(left)[:5])})")


if __name__ == "__main__":
    main()
