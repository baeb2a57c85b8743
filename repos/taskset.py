"""A repository task set as one self-contained artifact: the tasks, the snapshots they start from, the yield.

``build_task_set`` reads every source of a ``RepoTasksConfig`` (imported SWE-bench files with their local
repositories; bug injection), validates each task in the sandbox (imported ones too: the gold patch must resolve
in every run and an empty change must not), drops tasks whose problem statement or gold patch is contaminated by
an eval set, and splits by repository (a repository's tasks are all train or all val). It writes:

- ``tasks.parquet``: the SWE-bench rows, with codemill's columns (``split`` set);
- ``snapshots/<repo>.bundle``: per repository, a git bundle of one parentless commit per distinct base tree (the
  files a task starts from, no history), so the set grades and trains anywhere without the source repositories;
  ``snapshots.json`` maps each task to its bundle and commit;
- ``yield.json``: per source and repository, what was read, tried, kept, validated and dropped, and why.

``TaskSet`` opens such a folder: its tasks by split, and each task's snapshot and environment (unbundled into the
local cache once).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codemill.errors import UserFacingError
from codemill.hashing import sha256_file
from codemill.repos import git
from codemill.repos.cache import RepoCache
from codemill.repos.sources import BuildContext, MadeTask
from codemill.repos.task import RepoTask, read_tasks, write_tasks

if TYPE_CHECKING:
    from codemill.repos.config import RepoTasksConfig

REPO_TASKS_CODE_VERSION = "repo-tasks-v1"


def build_task_set(cfg: RepoTasksConfig, out_dir: Path, cache: RepoCache, workers: int,
                   say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every source's validated tasks into ``out_dir``; returns the stats the manifest keeps."""
    if not cfg.sources:
        raise UserFacingError("repo_tasks has no sources", hint="add an import or synthesis source to "
                                                               "repo_tasks.sources")
    scratch = Path(tempfile.mkdtemp(prefix="repo-tasks-", dir=cache.root if cache.root.exists() else None))
    try:
        ctx = BuildContext(cfg, cache, scratch, workers, say)
        made: list[MadeTask] = []
        yields = []
        for i, src in enumerate(cfg.sources):
            say(f"source {i}: {src.kind}")
            got, report = src.make(ctx)
            made += got
            yields.append({"source": i, "kind": src.kind, **report})
        kept, contaminated = _decontaminate(made, cfg.decontamination)
        from codemill.data.corpus import assign_split

        for m in kept:
            m.task = replace(m.task, split=assign_split(m.task.repo, cfg.val_fraction, cfg.split_salt))
        say(f"bundling the snapshots of {len(kept)} tasks")
        where = _bundle(kept, out_dir)
        write_tasks([m.task for m in kept], out_dir / "tasks.parquet")
        (out_dir / "snapshots.json").write_text(json.dumps(where, indent=1, sort_keys=True))
        (out_dir / "yield.json").write_text(json.dumps({"sources": yields, "contaminated": contaminated},
                                                       indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    splits = Counter(m.task.split for m in kept)
    return {"tasks": len(kept), "splits": {"train": splits.get("train", 0), "val": splits.get("val", 0)},
            "repositories": sorted({m.task.repo for m in kept}), "contaminated": len(contaminated),
            "by_operator": dict(Counter(m.task.mutation.split(" ", 1)[0] for m in kept if m.task.mutation)),
            "yield": yields}


def _decontaminate(made: list[MadeTask], dcfg: Any) -> tuple[list[MadeTask], list[dict[str, str]]]:
    """Drop tasks whose problem statement or gold patch holds ``threshold`` of an eval text's n-grams."""
    if not dcfg.enabled or not made:
        return made, []
    import polars as pl

    from codemill.data.decontaminate import build_index, contamination, load_eval_texts

    index = build_index(load_eval_texts(dcfg), dcfg.ngram)
    texts = pl.Series([m.task.problem_statement + "\n" + m.task.patch for m in made], dtype=pl.String)
    overlap, labels = contamination(texts, index, dcfg.ngram)
    kept, dropped = [], []
    for m, share, label in zip(made, overlap, labels, strict=True):
        if share >= dcfg.threshold:
            dropped.append({"instance_id": m.task.instance_id, "eval_text": str(label), "share": f"{share:.2f}"})
        else:
            kept.append(m)
    return kept, dropped


def _bundle(made: list[MadeTask], out_dir: Path) -> dict[str, dict[str, str]]:
    """One bundle per repository name with a parentless commit per distinct base tree (no history)."""
    where: dict[str, dict[str, str]] = {}
    (out_dir / "snapshots").mkdir(parents=True, exist_ok=True)
    by_repo: dict[str, list[MadeTask]] = {}
    for m in made:
        by_repo.setdefault(m.task.repo, []).append(m)
    for name, group in sorted(by_repo.items()):
        file = f"snapshots/{name.replace('/', '__')}.bundle"
        with tempfile.TemporaryDirectory(prefix="bundle-") as tmp:
            work = Path(tmp) / "r.git"
            git.git(tmp, "init", "-q", "--bare", "r.git")
            sources = sorted({str((m.repo / ".git" / "objects") if (m.repo / ".git").is_dir()
                                  else (m.repo / "objects")) for m in group})
            (work / "objects" / "info" / "alternates").write_text("\n".join(sources) + "\n")
            for m in group:
                tree = git.tree_of(m.repo, m.task.base_commit)
                commit = git.git(work, "commit-tree", tree, "-m", f"snapshot {tree[:12]}").strip()
                git.git(work, "update-ref", f"refs/snapshots/{tree}", commit)
                where[m.task.instance_id] = {"bundle": file, "commit": commit, "tree": tree,
                                             "requirements": json.dumps(list(m.requirements))}
            git.git(work, "bundle", "create", "-q", str(out_dir / file), "--all")
    return where


class TaskSet:
    """A built task set (``build_task_set``'s folder): tasks by split, each one's snapshot and environment."""

    def __init__(self, root: Path, cache: RepoCache | None = None) -> None:
        self.root, self.cache = Path(root), cache or RepoCache()
        if not (self.root / "tasks.parquet").is_file():
            raise UserFacingError(f"{root} is not a repository task set (no tasks.parquet)")
        self.where: dict[str, dict[str, str]] = json.loads((self.root / "snapshots.json").read_text())
        self._unbundled: dict[str, Path] = {}

    def tasks(self, split: str | None = None) -> list[RepoTask]:
        return [t for t in read_tasks(self.root / "tasks.parquet") if split is None or t.split == split]

    def snapshot(self, task: RepoTask) -> Path:
        w = self.where[task.instance_id]
        final = self.cache.root / "snapshots" / w["tree"]
        if final.is_dir():
            return final
        bundle = self.root / w["bundle"]
        repo = self._unbundled.get(w["bundle"])
        if repo is None:
            repo = self.cache.root / "unbundled" / sha256_file(bundle)[:16]
            if not repo.is_dir():
                repo.parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=".unbundle-", dir=repo.parent))
                git.git(tmp, "clone", "-q", "--mirror", str(bundle), "r.git")
                with contextlib.suppress(OSError):  # another process unbundled it first
                    os.rename(tmp / "r.git", repo)
                shutil.rmtree(tmp, ignore_errors=True)
            self._unbundled[w["bundle"]] = repo
        return self.cache.snapshot(repo, w["commit"])

    def env(self, task: RepoTask, snapshot: Path) -> Path:
        return self.cache.env(snapshot, json.loads(self.where[task.instance_id].get("requirements", "[]")))
