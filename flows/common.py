"""Helpers every flow shares."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from codemill import metrics, progress
from codemill.config import PipelineConfig
from codemill.lineage import Lineage
from codemill.store import ArtifactStore
from codemill.tasks.common import RunContext, StageResult
from codemill.tasks.fanout import task_runner_for

if TYPE_CHECKING:
    from codemill.flows.plan import Step


def flow_run_url() -> str | None:
    """This flow run's page in the Prefect UI, when a UI URL is configured."""
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_UI_URL

    base = PREFECT_UI_URL.value()
    return f"{base.rstrip('/')}/runs/flow-run/{flow_run.id}" if base and flow_run.id else None


def open_flow_run(config: PipelineConfig, run_name: str, flow_run_id: Any,
                  flow_run_url: str | None) -> tuple[ArtifactStore, RunContext, Lineage, str]:
    """The store, the context the tasks share, the lineage writer and this flow run's MLflow parent run."""
    store = ArtifactStore(config.store_root, cache_dir=f"{config.work_dir}/cache")
    ctx = RunContext(store_root=config.store_root, work_dir=config.work_dir,
                     tracking_uri=config.mlflow_tracking_uri, experiment=config.name)
    lineage = ctx.lineage()
    try:
        parent = lineage.start_parent(run_name, flow_run_id, flow_run_url, config.model_dump(mode="json"))
    except Exception:
        metrics.get().mlflow_unreachable.inc()
        raise
    return store, ctx.model_copy(update={"parent_run_id": parent}), lineage, parent


@contextmanager
def flow_run_metrics(config: PipelineConfig, flow_name: str) -> Iterator[None]:
    """Metrics on for this flow run when a Pushgateway is configured: pushed while it runs and at its end."""
    from prefect.runtime import flow_run

    from codemill.metrics.push import flow_metrics

    with flow_metrics(config.metrics.gateway(), flow_name, str(flow_run.id or "local"),
                      config.metrics.push_interval_s, config.metrics.delete_finished):
        yield


def close_live_vllm() -> None:
    """Close the process's vLLM engine (``evaluate.engine`` / ``rl.rollout.engine`` vllm), if one was started. Only
    the engines module starts one, so when it was never imported (a rerun that generated nothing) there is none,
    and torch, which that module imports, is not loaded for nothing (seconds)."""
    engines = sys.modules.get("codemill.models.engines")
    if engines is not None:
        engines.close_live_vllm()


def run_stage_task(task: Any, store: ArtifactStore, **params: Any) -> StageResult:
    """Run a stage task; a Prefect cache hit whose artifact is gone from the store is recomputed."""
    state = task(**params, return_state=True)
    result: StageResult = state.result()
    if state.name == "Cached" and not store.is_committed(result.ref):  # the store was wiped under Prefect's cache
        state = task.with_options(refresh_cache=True)(**params, return_state=True)
        result = state.result()
    if state.name == "Cached":
        result = result.model_copy(update={"status": "cached", "cost": {}})  # nothing spent in this run
        metrics.get().stage_runs.labels(result.ref.stage, "cached").inc()  # run_stage did not run to count it
    progress.sink().finished(result.ref.stage, f"{result.status}: {result.ref.uri}")
    return result


def execute(steps: list[Step], ctx: RunContext, store: ArtifactStore) -> dict[str, StageResult]:
    """Run planned steps in order (each skipped when its artifact is in the store): step key -> result."""
    results: dict[str, StageResult] = {}
    for step in steps:
        bound = step.bind(ctx, results) if step.bind else {}
        results[step.key] = run_stage_task(step.task, store, plan=step.plan, ctx=ctx, **step.params, **bound)
    return results


def eval_results(stages: dict[str, StageResult]) -> dict[str, StageResult]:
    """A run's evaluation steps (keyed ``eval:<suite>``), by suite."""
    return {k.removeprefix("eval:"): v for k, v in stages.items() if k.startswith("eval:")}


def scores_of(stages: dict[str, StageResult]) -> dict[str, float]:
    """The eval scores (and their CI bounds) of a run's evaluation steps."""
    out: dict[str, float] = {}
    for result in eval_results(stages).values():
        out |= {k: v for k, v in result.summary.items() if isinstance(v, float)}
    return out


def flow_result(lineage: Lineage, parent_run_id: str, config: PipelineConfig, stages: dict[str, StageResult],
                model_id: str | None, verdict: dict[str, Any] | None) -> dict[str, Any]:
    """Log the scores on the parent run, close it, and return what every flow (pipeline, nightly, evaluate)
    returns: one shape, so the CLI and callers read any of them alike."""
    from prefect.runtime import flow_run

    scores = scores_of(stages)
    lineage.log_metrics(parent_run_id, scores)
    lineage.end_run(parent_run_id)
    return {"parent_run_id": parent_run_id, "experiment_id": lineage.experiment_id,
            "tracking_uri": config.mlflow_tracking_uri, "flow_run_id": str(flow_run.id) if flow_run.id else None,
            "model_id": model_id, "scores": scores, "gate": verdict,
            "stages": {k: v.model_dump(mode="json") for k, v in stages.items()}}


def with_task_runner(flow_obj: Any, config: PipelineConfig) -> Any:
    """``flow_obj`` on the task runner ``config.ray_address`` asks for (unchanged when none is configured)."""
    runner = task_runner_for(config)
    return flow_obj if runner is None else flow_obj.with_options(task_runner=runner)
