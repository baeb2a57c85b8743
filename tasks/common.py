"""What every stage task shares: the run context, the result type, the cache key and skip-if-present."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import task
from prefect.context import TaskRunContext
from pydantic import BaseModel, Field

from codemill import metrics
from codemill.cost import measure
from codemill.lineage import Lineage
from codemill.lineage import tags as T
from codemill.lineage.check import absolute_tracking_uri
from codemill.plan import StagePlan
from codemill.store import ArtifactRef, ArtifactStore, ArtifactWriter, Manifest


class RunContext(BaseModel):
    """Where this flow run writes and logs. Not part of any cache key except the store root."""

    store_root: str
    work_dir: str
    tracking_uri: str
    experiment: str
    parent_run_id: str | None = None

    def store(self) -> ArtifactStore:
        return ArtifactStore(self.store_root, cache_dir=Path(self.work_dir) / "cache")

    def lineage(self) -> Lineage:
        return Lineage(self.tracking_uri, self.experiment)


class StageResult(BaseModel):
    ref: ArtifactRef
    status: str = Field(description="ran | present (found committed in the store)")
    run_id: str | None = None
    model_id: str | None = None
    summary: dict[str, Any] = Field(default_factory=dict)
    cost: dict[str, float] = Field(default_factory=dict, description="wall_s, cpu_s, gpu_s of producing it in "
                                   "this run (empty when it was found in the store)")


SERVER_RETRY_DELAYS: list[float] = [10, 30, 60]  # seconds; a tracking server restart takes ~30 s


def retry_on_server_error(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a stage only when a server (MLflow, S3) did not answer; bad input fails at once.
    Retries are cheap: a stage whose artifact was committed before the failure is found in the store."""
    import requests

    exc = state.result(raise_on_failure=False)
    while isinstance(exc, BaseException):
        if isinstance(exc, ConnectionError | TimeoutError | requests.ConnectionError | requests.Timeout) or (
                type(exc).__name__ == "MlflowException" and any(
                    s in str(exc) for s in ("Max retries exceeded", "Connection refused", "Read timed out"))):
            metrics.get().server_retries.inc()
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def artifact_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """The Prefect cache key is the artifact digest, the store it lives in and the tracking server that records
    it: a run on another MLflow must still reach ``run_stage``, which records the stage there (a cache hit would
    hand back a run id from the other server's database). Both are made absolute, so the default relative
    ``.codemill/store`` and ``sqlite:///mlflow.db`` of two working folders are two keys, not one."""
    plan: StagePlan = parameters["plan"]
    ctx: RunContext = parameters["ctx"]
    store = ArtifactStore(ctx.store_root).root_uri.rstrip("/")
    return f"codemill-{plan.stage}-{plan.digest}-{store}-{absolute_tracking_uri(ctx.tracking_uri)}"


def stage_task(name: str, **options: Any) -> Callable[[Callable[..., StageResult]], Any]:
    """The Prefect task of a stage that commits an artifact: cached on the artifact digest, its result persisted
    (not held in memory), retried only when a server did not answer. ``options`` add to these (e.g. a run name)."""
    return task(name=name, cache_key_fn=artifact_cache_key, persist_result=True, cache_result_in_memory=False,
                retry_condition_fn=retry_on_server_error, retries=len(SERVER_RETRY_DELAYS),
                retry_delay_seconds=SERVER_RETRY_DELAYS, **options)


Producer = Callable[[ArtifactWriter, str], Manifest]  # (writer, stage run id)
Recorder = Callable[[Lineage, str, Manifest], dict[str, Any]]


def run_stage(ctx: RunContext, plan: StagePlan, produce: Producer, record: Recorder,
              summarize: Callable[[Manifest], dict[str, Any]], *, gpus: int = 0,
              system_metrics: bool = False) -> StageResult:
    """Skip if committed; else produce under a writer (manifest last). Then make sure MLflow knows it.

    Every stage run records its plan (the hashed config as params, the input digests as tags) and its
    manifest; ``record`` adds what is particular to the stage. Recording runs after a fresh produce, and also
    when the artifact was already in the store but this tracking server has no run for it (a new MLflow DB).
    A produced stage logs what it cost (``cost_wall_s``, ``cost_cpu_s``, ``cost_gpu_s``; ``gpus``: the GPUs it
    holds); ``system_metrics`` turns on MLflow's CPU/memory/GPU sampling on its run.
    """
    try:
        return _run_stage(ctx, plan, produce, record, summarize, gpus, system_metrics)
    except BaseException:
        metrics.get().stage_runs.labels(plan.stage, "failed").inc()
        raise


def count_stage(result: StageResult, manifest: Manifest) -> None:
    """A stage run in the metrics: its result, and what a produced stage cost and committed."""
    m, stage = metrics.get(), result.ref.stage
    m.stage_runs.labels(stage, result.status).inc()
    if result.status == "ran":
        m.stage_wall_seconds.labels(stage).inc(result.cost.get("wall_s", 0.0))
        m.stage_cpu_seconds.labels(stage).inc(result.cost.get("cpu_s", 0.0))
        m.stage_gpu_seconds.labels(stage).inc(result.cost.get("gpu_s", 0.0))
        m.artifacts_committed.labels(stage).inc()
        m.artifact_bytes.labels(stage).inc(sum(f.bytes for f in manifest.files))


def _run_stage(ctx: RunContext, plan: StagePlan, produce: Producer, record: Recorder,
               summarize: Callable[[Manifest], dict[str, Any]], gpus: int, system_metrics: bool) -> StageResult:
    store = ctx.store()
    lineage = ctx.lineage()
    ref = store.ref_for(plan)
    status = "present"
    cost: dict[str, float] = {}

    def record_all(run_id: str, manifest: Manifest) -> dict[str, Any]:
        lineage.record_plan(run_id, plan, manifest, ref)
        return record(lineage, run_id, manifest)

    if store.is_committed(ref):
        manifest = store.read_manifest(ref)
        run_id = lineage.find_stage_run(ref.stage, ref.digest)
        if run_id is None:
            with lineage.stage_run(ctx.parent_run_id, ref.stage, ref.digest) as run_id:
                lineage.tag(run_id, {T.REREGISTERED: "true"})
                extra = record_all(run_id, manifest)
        else:
            model_id = lineage.run_tags(run_id).get(T.MODEL_ID)
            extra = {"model_id": model_id} if model_id else {}
    else:
        status = "ran"
        with lineage.stage_run(ctx.parent_run_id, ref.stage, ref.digest, system_metrics) as run_id:
            with measure(gpus) as spent, store.writer(plan) as writer:
                produce(writer, run_id)
            manifest = store.read_manifest(ref)
            extra = record_all(run_id, manifest)
            lineage.log_metrics(run_id, spent.metrics())
        cost = spent.as_dict()
    result = StageResult(ref=ref, status=status, run_id=run_id, model_id=extra.get("model_id"),
                         summary={**summarize(manifest), **extra}, cost=cost)
    count_stage(result, manifest)
    return result
