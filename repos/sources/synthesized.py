"""``synthesis``: tasks made by bug injection from repositories with pytest suites (``codemill.repos.synthesis``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from codemill.repos.sources.base import BuildContext, MadeTask, RepoTaskSource
from codemill.stage_config import StageConfig


class RepositoryConfig(StageConfig):
    """A local git repository (a work tree or a bare repository) that tasks are made from."""

    name: str = Field(description="The tasks' `repo` (owner/name or a name).")
    path: str = Field(description="Its local folder; nothing is fetched.")
    commit: str = Field("HEAD", description="The commit the tasks start from (resolved to its hash when planned).")
    requirements: list[str] = Field(default_factory=list, description="Installed distributions its tests need "
                                    "besides pytest (linked into its execution environment).")


class SynthesizedRepoTasksConfig(RepoTaskSource):
    """Tasks made by bug injection from repositories with pytest suites (codemill.repos.synthesis)."""

    kind: Literal["synthesis"] = "synthesis"
    repositories: list[RepositoryConfig] = Field(default_factory=list, description="Where bugs are injected.")
    per_operator: int = Field(4, ge=1, description="Mutants tried per operator and repository.")
    seed: int = Field(0, description="Which mutants are sampled.")
    min_pass_rate: float = Field(0.8, gt=0, le=1, description="A repository is admitted when this share of its "
                                                              "(non-flaky) tests pass at the commit.")

    def fingerprint(self, index: int) -> list[dict[str, str]]:
        """Each repository's resolved commit."""
        from codemill.repos.git import resolve_commit

        return [{"key": f"source.{index}.{r.name}", "kind": "repository", "name": r.name,
                 "digest": resolve_commit(r.path, r.commit), "uri": r.path} for r in self.repositories]

    def make(self, ctx: BuildContext) -> tuple[list[MadeTask], dict[str, Any]]:
        from codemill.repos.synthesis import Synthesizer

        synth = Synthesizer(ctx.cache, ctx.scratch / "task-repos", per_operator=self.per_operator, seed=self.seed,
                            min_pass_rate=self.min_pass_rate, validation_runs=ctx.cfg.validation_runs,
                            wall_s=ctx.cfg.wall_s, workers=ctx.workers, on_progress=ctx.say)
        made, reports = [], []
        for r in self.repositories:
            report = synth.synthesize(r.name, Path(r.path), r.commit, r.requirements)
            reports.append(report.summary())
            made += [MadeTask(t, ctx.scratch / "task-repos" / r.name, tuple(r.requirements)) for t in report.tasks]
        return made, {"repositories": reports}
