"""The repo_tasks section: repositories and task sources (imported or synthesised), validation and split."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from codemill.data.config import DecontaminationConfig
from codemill.stage_config import StageConfig, runtime_only


class RepositoryConfig(StageConfig):
    """A local git repository (a work tree or a bare repository) that tasks are made from."""

    name: str = Field(description="The tasks' `repo` (owner/name or a name).")
    path: str = Field(description="Its local folder; nothing is fetched.")
    commit: str = Field("HEAD", description="The commit the tasks start from (resolved to its hash when planned).")
    requirements: list[str] = Field(default_factory=list, description="Installed distributions its tests need "
                                    "besides pytest (linked into its execution environment).")


class ImportedRepoTasksConfig(StageConfig):
    """SWE-bench-format tasks from a file, with their repositories in a local folder."""

    kind: Literal["import"] = "import"
    tasks: str = Field(description="JSONL or Parquet of SWE-bench instances (local path or fsspec URL).")
    repos: str = Field(description="Folder with one git repository per task `repo` (owner/name, owner__name or "
                                   "name).")


class SynthesizedRepoTasksConfig(StageConfig):
    """Tasks made by bug injection from repositories with pytest suites (codemill.repos.synthesis)."""

    kind: Literal["synthesis"] = "synthesis"
    repositories: list[RepositoryConfig] = Field(default_factory=list, description="Where bugs are injected.")
    per_operator: int = Field(4, ge=1, description="Mutants tried per operator and repository.")
    seed: int = Field(0, description="Which mutants are sampled.")
    min_pass_rate: float = Field(0.8, gt=0, le=1, description="A repository is admitted when this share of its "
                                                              "(non-flaky) tests pass at the commit.")


RepoTaskSourceConfig = Annotated[ImportedRepoTasksConfig | SynthesizedRepoTasksConfig, Field(discriminator="kind")]


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
