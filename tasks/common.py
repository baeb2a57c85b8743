"""What every stage task shares: the run context, the result type, the cache key and skip-if-present."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.context import TaskRunContext
from pydantic import BaseModel, Field

from codemill import metrics, progress
from codemill.cost import measure
from codemill.lineage import Lineage
from codemill.lineage import tags as T
from codemill.lineage.check import absolute_tracking_uri
from codemill.plan import StagePlan
from codemill.store import ArtifactRef, ArtifactStore, ArtifactWriter, Manifest
from codemill.store_claim import Claim, ClaimOwner, default_wait_s


class RunContext(BaseModel):
    """Where this flow run writes and logs. Not part of any cache key except the store root."""

    store_root: str
    work_dir: str
    tracking_uri: str
    experiment: str
    parent_run_id: str | None = None
    store_wait_s: float = Field(default_factory=default_wait_s, description="How long a stage waits for another "
                                "run building the same artifact (``store_claim``).")

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
    waited_for: dict[str, Any] | None = Field(None, description="The owner record (run, pid, host, since) of the "
                                              "run that was building this artifact when this run needed it")
    waited_s: float = Field(0.0, description="How long this run waited for that run")


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
    known = lineage.find_stage_run(ref.stage, ref.digest) if store.is_committed(ref) else None
    if known is not None:  # in the store and recorded on this tracking server: nothing to do
        manifest = store.read_manifest(ref)
        result = _present(lineage, ref, known, manifest, summarize)
    else:  # one run builds (or records) it; a run that needs it meanwhile waits for that one and reuses it
        with claimed(ctx, store, ref.stage, f"{ref.name}-{ref.short}") as claim:
            result, manifest = _build_or_record(ctx, plan, produce, record, summarize, gpus, system_metrics)
        if claim.waited_for is not None:
            result = result.model_copy(update={"waited_for": claim.waited_for.model_dump(mode="json"),
                                               "waited_s": round(claim.waited_s, 3)})
            _logger().info("%s: %s after waiting %.0f s for %s", ref.stage,
                           "reused its artifact" if result.status == "present" else "built it here",
                           claim.waited_s, claim.waited_for.describe())
    count_stage(result, manifest)
    return result


def _present(lineage: Lineage, ref: ArtifactRef, run_id: str, manifest: Manifest,
             summarize: Callable[[Manifest], dict[str, Any]]) -> StageResult:
    """An artifact in the store whose stage run this tracking server has."""
    model_id = lineage.run_tags(run_id).get(T.MODEL_ID)
    extra = {"model_id": model_id} if model_id else {}
    return StageResult(ref=ref, status="present", run_id=run_id, model_id=model_id,
                       summary={**summarize(manifest), **extra})


def _build_or_record(ctx: RunContext, plan: StagePlan, produce: Producer, record: Recorder,
                     summarize: Callable[[Manifest], dict[str, Any]], gpus: int, system_metrics: bool
                     ) -> tuple[StageResult, Manifest]:
    """Under the stage's claim: produce the artifact and record it, or, when it is in the store (built by the run
    this one waited for, or recorded only on another tracking server), record what this server lacks."""
    store, lineage = ctx.store(), ctx.lineage()
    ref = store.ref_for(plan)

    def record_all(run_id: str, manifest: Manifest) -> dict[str, Any]:
        lineage.record_plan(run_id, plan, manifest, ref)
        return record(lineage, run_id, manifest)

    if store.is_committed(ref):
        manifest = store.read_manifest(ref)
        found = lineage.find_stage_run(ref.stage, ref.digest)
        if found is not None:
            return _present(lineage, ref, found, manifest, summarize), manifest
        with lineage.stage_run(ctx.parent_run_id, ref.stage, ref.digest) as run_id:
            lineage.tag(run_id, {T.REREGISTERED: "true"})
            extra = record_all(run_id, manifest)
        return StageResult(ref=ref, status="present", run_id=run_id, model_id=extra.get("model_id"),
                           summary={**summarize(manifest), **extra}), manifest
    with lineage.stage_run(ctx.parent_run_id, ref.stage, ref.digest, system_metrics) as run_id:
        with measure(gpus) as spent, store.writer(plan) as writer:
            produce(writer, run_id)
        manifest = store.read_manifest(ref)
        extra = record_all(run_id, manifest)
        lineage.log_metrics(run_id, spent.metrics())
    return StageResult(ref=ref, status="ran", run_id=run_id, model_id=extra.get("model_id"),
                       summary={**summarize(manifest), **extra}, cost=spent.as_dict()), manifest


def run_label() -> str:
    """This run as a claim's owner record names it: the Prefect flow run's name (and id)."""
    from prefect.runtime import flow_run

    name, run_id = flow_run.name, flow_run.id
    return f"{name} ({run_id})" if name and run_id else str(name or run_id or "outside a flow run")


def _logger() -> logging.Logger | logging.LoggerAdapter:
    """The task run's logger (the Prefect UI shows it), or this module's outside a run."""
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


@contextmanager
def claimed(ctx: RunContext, store: ArtifactStore, stage: str, key: str) -> Iterator[Claim]:
    """Hold the claim on ``key`` of ``stage`` (``ArtifactStore.claim``), saying in the log and on the stage's
    progress row whom this run waits for, and when it takes over from a run that died holding it."""
    logger = _logger()

    def on_wait(owner: ClaimOwner) -> None:
        logger.info("%s/%s: waiting for %s, which is building it; this run reuses what it commits", stage, key,
                    owner.describe())
        progress.sink().stage(stage, f"waiting for {owner.describe()}")

    with store.claim(stage, key, run_label(), ctx.store_wait_s, on_wait) as claim:
        if claim.took_over is not None:
            logger.warning("%s/%s: %s died holding it without finishing; this run does it instead", stage, key,
                           claim.took_over.describe())
        yield claim
