"""What a repository-task source kind is: a config (with its ``kind``) that fingerprints what its tasks depend on
and makes validated tasks. One module per kind, registered in ``codemill.repos.sources``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codemill.stage_config import StageConfig

if TYPE_CHECKING:
    from codemill.repos.cache import RepoCache
    from codemill.repos.config import RepoTasksConfig
    from codemill.repos.task import RepoTask

Say = Callable[[str], None]


@dataclass
class MadeTask:
    """A validated task and where its base commit lives (until the snapshots are bundled)."""

    task: RepoTask
    repo: Path
    requirements: tuple[str, ...]


@dataclass(frozen=True)
class BuildContext:
    """What every source kind builds with: the stage's settings, the repository cache, a scratch folder, how many
    test runs at once, and where progress lines go."""

    cfg: RepoTasksConfig
    cache: RepoCache
    scratch: Path
    workers: int
    say: Say


class RepoTaskSource(StageConfig):
    """The base of a source kind's config (each kind narrows ``kind`` to its ``Literal``)."""

    kind: str

    def fingerprint(self, index: int) -> list[dict[str, str]]:
        """What this source's tasks depend on, by content (``key``, ``kind``, ``name``, ``digest``, ``uri``); a
        missing input stops here, before any work."""
        raise NotImplementedError

    def make(self, ctx: BuildContext) -> tuple[list[MadeTask], dict[str, Any]]:
        """Its validated tasks, and the yield report the artifact keeps for it."""
        raise NotImplementedError
