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
from codemill.flows.common import eval_results, scores_of
from codemill.flows.evaluate import gate_against_champion
from codemill.flows.hooks import record_failure_on_mlflow, run_name_from
from codemill.flows.plan import plan_run
from codemill.flows.run import open_run
from codemill.flows.seeds import seed_evals
from codemill.lineage import tags as T
from codemill.plan import Phase
from codemill.tasks.ingest import fingerprint_sources_task
from codemill.tasks.resolve_model import trained_model


def _run_name() -> str:
    return run_name_from(flow_run.flow_name or "pipeline", flow_run.parameters)


def run_pipeline(config: PipelineConfig, until: str = "evaluate", flow_name: str = "pipeline") -> dict[str, Any]:
    """The body shared by ``pipeline`` and ``nightly`` (call it inside a flow): planned once, then run; the
    flow carries the plan, not the config."""
    logger = get_run_logger()
    with open_run(config, flow_name) as run:
        plan = plan_run(config, fingerprint_sources_task(config.ingest), run.store, until)
        stages = run.execute(plan.steps)
        verdict = None
        if plan.gate is not None:
            verdict = gate_against_champion(run, plan.gate, trained_model(run.ctx, stages["train"]),
                                            run.store.ref_for(plan.steps[0].plan), eval_results(stages),
                                            seed_evals(plan.seeds, stages))
        model_id = stages["train"].model_id if "train" in stages else None
        run.tag_stages(stages, {T.UNTIL: until, **({T.MODEL_ID: model_id} if model_id else {})})
        publish_run_artifacts(run.store, run.lineage, run.parent, flow_run.name or flow_name, stages,
                              scores_of(stages), verdict)
        for name, st in stages.items():
            logger.info("%-9s %-8s %s", name, st.status, st.ref.uri)
        return run.finish(stages, model_id, verdict)


@flow(name="pipeline", flow_run_name=_run_name, persist_result=True, log_prints=True,
      on_failure=[record_failure_on_mlflow], on_crashed=[record_failure_on_mlflow])
def pipeline(config: PipelineConfig = PipelineConfig(), until: Phase = "evaluate") -> dict[str, Any]:  # noqa: B008
    """Corpus -> tokens -> checkpoint -> eval, stopping after ``until``. Each stage is skipped when its
    artifact digest is already in the store."""
    return run_pipeline(config, until, "pipeline")
