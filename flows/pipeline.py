"""The ``pipeline`` flow: ingest -> tokenize -> train -> evaluate -> gate, with one MLflow parent run per flow
run.

The run is planned first (every step's digest, from the config and the source fingerprints; see
``flows.plan``), then executed; ``until`` keeps the steps up to a stage. With ``train.seeds`` > 1 the
candidate is also trained and evaluated at seeds ``seed + 1 ...`` (planned steps ``seed<N>:train``,
``seed<N>:<suite>``), and the gate compares the mean of all its seeds. Steps whose artifacts are already in
the store are skipped, so running "until train" after "until tokenize" redoes nothing.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.artifacts import publish_run_artifacts
from codemill.flows.common import (
    close_live_vllm,
    eval_results,
    execute,
    flow_result,
    flow_run_metrics,
    flow_run_url,
    open_flow_run,
    scores_of,
)
from codemill.flows.evaluate import gate_against_champion
from codemill.flows.hooks import record_failure_on_mlflow, run_name_from, tag_current_flow_run
from codemill.flows.plan import plan_pipeline
from codemill.flows.seeds import seed_evals
from codemill.lineage import tags as T
from codemill.plan import Phase
from codemill.tasks.ingest import fingerprint_sources_task
from codemill.tasks.resolve_model import trained_model


def _run_name() -> str:
    return run_name_from(flow_run.flow_name or "pipeline", flow_run.parameters)


def run_pipeline(config: PipelineConfig, until: str = "evaluate", flow_name: str = "pipeline") -> dict[str, Any]:
    """The body shared by ``pipeline`` and ``nightly`` (call it inside a flow), its metrics pushed when on."""
    try:
        with flow_run_metrics(config, flow_name):
            return _run_pipeline(config, until, flow_name)
    finally:
        close_live_vllm()  # the suites' vLLM engine (evaluate.engine vllm)


def _run_pipeline(config: PipelineConfig, until: str, flow_name: str) -> dict[str, Any]:
    logger = get_run_logger()
    tag_current_flow_run(flow_name)
    store, ctx, lineage, parent = open_flow_run(config, flow_run.name or flow_name, flow_run.id, flow_run_url())
    verdict = None
    try:
        steps = plan_pipeline(config, fingerprint_sources_task(config.ingest), store, until)
        stages = execute(steps, ctx, store)
        if until == "evaluate":
            verdict = gate_against_champion(ctx, store, config, trained_model(ctx, stages["train"]),
                                            store.ref_for(steps[0].plan), eval_results(stages),
                                            seed_evals(config, stages))
    except BaseException:
        lineage.end_run(parent, failed=True)
        raise
    model_id = stages["train"].model_id if "train" in stages else None
    lineage.tag(parent, {**{T.stage_status(k): v.status for k, v in stages.items()},
                         **{T.stage_digest(k): v.ref.digest for k, v in stages.items()},
                         T.UNTIL: until, **({T.MODEL_ID: model_id} if model_id else {})})
    publish_run_artifacts(store, lineage, parent, flow_run.name or flow_name, stages, scores_of(stages), verdict)
    for name, st in stages.items():
        logger.info("%-9s %-8s %s", name, st.status, st.ref.uri)
    return flow_result(lineage, parent, config, stages, model_id, verdict)


@flow(name="pipeline", flow_run_name=_run_name, persist_result=True, log_prints=True,
      on_failure=[record_failure_on_mlflow], on_crashed=[record_failure_on_mlflow])
def pipeline(config: PipelineConfig = PipelineConfig(), until: Phase = "evaluate") -> dict[str, Any]:  # noqa: B008
    """Corpus -> tokens -> checkpoint -> eval, stopping after ``until``. Each stage is skipped when its
    artifact digest is already in the store."""
    return run_pipeline(config, until, "pipeline")
