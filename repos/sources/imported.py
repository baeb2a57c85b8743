"""``import``: SWE-bench-format tasks from a file, with their repositories in a local folder. Each task is
validated like a synthesised one: its gold patch must resolve in every run and an empty change must not."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from codemill.errors import UserFacingError
from codemill.plan import file_input
from codemill.repos import git
from codemill.repos.git import repo_folder
from codemill.repos.pytest_run import repo_sandbox
from codemill.repos.sources.base import BuildContext, MadeTask, RepoTaskSource
from codemill.repos.synthesis import validate
from codemill.repos.task import RepoTask, read_tasks


class ImportedRepoTasksConfig(RepoTaskSource):
    """SWE-bench-format tasks from a file, with their repositories in a local folder."""

    kind: Literal["import"] = "import"
    tasks: str = Field(description="JSONL or Parquet of SWE-bench instances (local path or fsspec URL).")
    repos: str = Field(description="Folder with one git repository per task `repo` (owner/name, owner__name or "
                                   "name).")

    def fingerprint(self, index: int) -> list[dict[str, str]]:
        """The file's hash: its rows name their commits."""
        ref = file_input(f"tasks.{index}", self.tasks)
        return [{"key": f"source.{index}.import", "kind": "file", "name": self.tasks, "digest": ref.digest,
                 "uri": self.tasks}]

    def make(self, ctx: BuildContext) -> tuple[list[MadeTask], dict[str, Any]]:
        tasks = read_tasks(self.tasks)
        sandbox = repo_sandbox(ctx.cfg.wall_s)

        def one(task: RepoTask) -> MadeTask | str:
            repo = repo_folder(Path(self.repos), task.repo)
            try:
                git.resolve_commit(repo, task.base_commit)
            except UserFacingError:
                return "missing repository or commit"
            out = validate(task, ctx.cache, repo, sandbox, ctx.scratch, ctx.cfg.validation_runs)
            return out if isinstance(out, str) else MadeTask(replace(out, source=self.kind), repo, ())

        with ThreadPoolExecutor(max(1, ctx.workers)) as pool:
            results = list(pool.map(one, tasks))
        dropped = Counter(r for r in results if isinstance(r, str))
        made = [r for r in results if not isinstance(r, str)]
        return made, {"tasks": self.tasks, "read": len(tasks), "validated": len(made), "dropped": dict(dropped)}
