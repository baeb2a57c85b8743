"""Repository-task source kinds, one module each, registered here by ``kind``: each module's config (a
``RepoTaskSource``) fingerprints its inputs and makes validated tasks, and ``repo_tasks.sources`` takes the
discriminated union of the registered configs. Adding a kind is its module plus its config in the tuple below."""

from __future__ import annotations

from codemill.repos.sources import imported, synthesized
from codemill.repos.sources.base import BuildContext, MadeTask, RepoTaskSource

SOURCE_KINDS: dict[str, type[RepoTaskSource]] = {
    cfg.model_fields["kind"].default: cfg
    for cfg in (imported.ImportedRepoTasksConfig, synthesized.SynthesizedRepoTasksConfig)
}

__all__ = ["SOURCE_KINDS", "BuildContext", "MadeTask", "RepoTaskSource"]
