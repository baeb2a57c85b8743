"""Helpers every flow shares."""

from __future__ import annotations

from typing import Any

from codemill import progress
from codemill.config import PipelineConfig
from codemill.lineage import Lineage
from codemill.store import ArtifactStore
from codemill.tasks.common import RunContext, StageResult
from codemill.tasks.fanout import task_runner_for


def flow_run_url() -> str | None:
    """This flow run's page in the Prefect UI, when a UI URL is configured."""
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_UI_URL

    base = PREFECT_UI_URL.value()
    return f"{base.rstrip('/')}/runs/flow-run/{flow_run.id}" if base and flow_run.id else None


def open_flow_run(config: PipelineConfig, run_name: str, flow_run_id: Any,
                  flow_run_url: str | None) -> tuple[ArtifactStore, RunContext, Lineage]:
    """The store, the context the tasks share, and the MLflow parent run of this flow run."""
    store = ArtifactStore(config.store_root, cache_dir=f"{config.work_dir}/cache")
    ctx = RunContext(store_root=config.store_root, work_dir=config.work_dir,
                     tracking_uri=config.mlflow_tracking_uri, experiment=config.name)
    lineage = ctx.lineage()
    parent = lineage.start_parent(run_name, flow_run_id, flow_run_url, config.model_dump(mode="json"))
    return store, ctx.model_copy(update={"parent_run_id": parent}), lineage


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


def with_task_runner(flow_obj: Any, config: PipelineConfig) -> Any:
    """``flow_obj`` on the task runner ``config.ray_address`` asks for (unchanged when none is configured)."""
    runner = task_runner_for(config)
    return flow_obj if runner is None else flow_obj.with_options(task_runner=runner)
