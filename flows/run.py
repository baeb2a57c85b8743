"""The life of one flow run, the same for every codemill flow: metrics pushed while it runs, the store and the
context the tasks share, an MLflow parent run that ends FAILED when the body raises, the process's vLLM engine
closed at the end, and one result shape. A flow body is ``with open_run(config, name) as run:`` and
``run.finish(...)``; nothing of this is written twice."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from codemill import metrics, progress
from codemill.config import PipelineConfig
from codemill.flows.common import scores_of
from codemill.lineage import Lineage
from codemill.lineage import tags as T
from codemill.store import ArtifactStore
from codemill.tasks.common import RunContext, StageResult

if TYPE_CHECKING:
    from codemill.flows.plan import Step


@dataclass
class FlowRun:
    """One flow run's store, task context, lineage writer and MLflow parent run."""

    store: ArtifactStore
    ctx: RunContext
    lineage: Lineage
    parent: str
    flow_run_id: str | None

    def execute(self, steps: list[Step]) -> dict[str, StageResult]:
        """Run planned steps in order, each skipped when its artifact is in the store: step key -> result."""
        results: dict[str, StageResult] = {}
        for step in steps:
            bound = step.bind(self.ctx, results) if step.bind else {}
            results[step.key] = run_stage_task(step.task, self.store, plan=step.plan, ctx=self.ctx, **step.params,
                                               **bound)
        return results

    def tag_stages(self, stages: dict[str, StageResult], tags: dict[str, str] | None = None) -> None:
        """Each stage's status and artifact digest (and ``tags``) on the parent run, for MLflow's run list."""
        self.lineage.tag(self.parent, {**{T.stage_status(k): v.status for k, v in stages.items()},
                                       **{T.stage_digest(k): v.ref.digest for k, v in stages.items()}, **(tags or {})})

    def finish(self, stages: dict[str, StageResult], model_id: str | None = None,
               verdict: dict[str, Any] | None = None) -> dict[str, Any]:
        """Log the scores on the parent run, close it, and return what every flow returns: one shape, so the
        CLI and callers read any of them alike."""
        scores = scores_of(stages)
        self.lineage.log_metrics(self.parent, scores)
        self.lineage.end_run(self.parent)
        return {"parent_run_id": self.parent, "experiment_id": self.lineage.experiment_id,
                "tracking_uri": self.ctx.tracking_uri, "flow_run_id": self.flow_run_id, "model_id": model_id,
                "scores": scores, "gate": verdict, "stages": {k: v.model_dump(mode="json") for k, v in stages.items()}}


@contextmanager
def open_run(config: PipelineConfig, flow_name: str, tag: bool = True) -> Iterator[FlowRun]:
    """Open this flow run (call it inside the flow): metrics on when a Pushgateway is configured, Prefect tags
    (``tag``), the store and the MLflow parent run. When the body raises the parent run ends FAILED; the vLLM
    engine the suites or rollouts started is closed either way, its memory back for what follows."""
    from prefect.runtime import flow_run

    from codemill.flows.hooks import tag_current_flow_run
    from codemill.metrics.push import flow_metrics

    run_id = str(flow_run.id) if flow_run.id else None
    settings = config.metrics
    try:
        with flow_metrics(settings.gateway(), flow_name, run_id or "local", settings.push_interval_s,
                          settings.delete_finished):
            if tag:
                tag_current_flow_run(flow_name)
            store = ArtifactStore(config.store_root, cache_dir=f"{config.work_dir}/cache")
            ctx = RunContext(store_root=config.store_root, work_dir=config.work_dir,
                             tracking_uri=config.mlflow_tracking_uri, experiment=config.name)
            lineage = ctx.lineage()
            try:
                parent = lineage.start_parent(flow_run.name or flow_name, run_id, flow_run_url(),
                                              config.model_dump(mode="json"))
            except Exception:
                metrics.get().mlflow_unreachable.inc()
                raise
            run = FlowRun(store, ctx.model_copy(update={"parent_run_id": parent}), lineage, parent, run_id)
            try:
                yield run
            except BaseException:
                run.lineage.end_run(run.parent, failed=True)
                raise
    finally:
        close_live_vllm()


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


def flow_run_url() -> str | None:
    """This flow run's page in the Prefect UI, when a UI URL is configured."""
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_UI_URL

    base = PREFECT_UI_URL.value()
    return f"{base.rstrip('/')}/runs/flow-run/{flow_run.id}" if base and flow_run.id else None


def close_live_vllm() -> None:
    """Close the process's vLLM engine (``evaluate.engine`` / ``rl.rollout.engine`` vllm), if one was started. Only
    the engines module starts one, so when it was never imported (a rerun that generated nothing) there is none,
    and torch, which that module imports, is not loaded for nothing (seconds)."""
    engines = sys.modules.get("codemill.models.engines")
    if engines is not None:
        engines.close_live_vllm()
