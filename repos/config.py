"""The repo_tasks section: task sources (one config per registered kind, in ``codemill.repos.sources``),
validation and split."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from codemill.data.config import DecontaminationConfig
from codemill.registry import tagged_union
from codemill.repos.sources import SOURCE_KINDS, RepoTaskSource
from codemill.stage_config import StageConfig, runtime_only

if TYPE_CHECKING:
    RepoTaskSourceConfig = RepoTaskSource
else:  # one member per registered source kind
    RepoTaskSourceConfig = tagged_union(list(SOURCE_KINDS.values()), "kind")


class RepoTasksConfig(StageConfig):
    """Repository tasks (`codemill repo-tasks build`): imported or synthesised, validated in the sandbox (the gold
    patch resolves in every run, an empty change does not), decontaminated, split by repository."""

    sources: list[RepoTaskSourceConfig] = Field(default_factory=list, description="Task sources.")
    validation_runs: int = Field(3, ge=1, description="Runs in which the gold patch must resolve.")
    decontamination: DecontaminationConfig = Field(
        default_factory=DecontaminationConfig, description="Drop tasks whose problem statement or gold patch holds "
                                                           "this share of an eval text's n-grams.")
    val_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="Share of repositories whose tasks go to val.")
    split_salt: str = Field("codemill-split-v1", description="Salt of the split hash (by repository).")
    wall_s: float = Field(300.0, gt=0, description="Wall clock of one test run of a task.")
    workers: int | None = runtime_only(default=None, description="Test runs at once; empty = usable cores.")
