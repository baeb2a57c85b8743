"""Helpers every flow shares."""

from __future__ import annotations

from typing import Any

from codemill import progress
from codemill.store import ArtifactStore
from codemill.tasks.common import StageResult


def run_stage_task(task, store: ArtifactStore, **params: Any) -> StageResult:
    """Run a stage task; a Prefect cache hit whose artifact is gone from the store is recomputed."""
    state = task(**params, return_state=True)
    result: StageResult = state.result()
    if state.name == "Cached" and not store.is_committed(result.ref):
        state = task.with_options(refresh_cache=True)(**params, return_state=True)
        result = state.result()
    if state.name == "Cached":
        result = result.model_copy(update={"status": "cached"})
    progress.sink().stage(result.ref.stage, f"{result.status}: {result.ref.uri}")
    return result
