"""The ``pipeline`` flow: ingest -> tokenize -> train -> evaluate, with one MLflow parent run per flow run.

``until`` stops after a stage (the per-stage deployments); earlier stages are skipped when their artifacts
are already in the store, so running "until train" after "until tokenize" redoes nothing.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.artifacts import publish_run_artifacts
from codemill.flows.common import flow_run_url, open_flow_run, run_stage_task
from codemill.flows.evaluation import evaluate_model, gate_against_champion, scores_of
from codemill.flows.hooks import record_failure_on_mlflow, run_name_from, tag_current_flow_run
from codemill.tasks.common import StageResult
from codemill.tasks.ingest import fingerprint_sources_task, ingest_task, plan_ingest
from codemill.tasks.models import from_train_artifact
from codemill.tasks.tokenize import plan_tokenize, plan_tokenizer, tokenize_task, tokenizer_task
from codemill.tasks.train import plan_train, train_task

Stage = Literal["ingest", "tokenize", "train", "evaluate"]
ORDER: tuple[str, ...] = ("ingest", "tokenize", "train", "evaluate")


def _run_name() -> str:
    return run_name_from(flow_run.flow_name or "pipeline", flow_run.parameters)


def run_pipeline(config: PipelineConfig, until: str = "evaluate", flow_name: str = "pipeline") -> dict[str, Any]:
    """The body shared by ``pipeline`` and ``nightly`` (call it inside a flow)."""
    if until not in ORDER:
        raise ValueError(f"until must be one of {', '.join(ORDER)}, not {until!r}")
    last = ORDER.index(until)
    logger = get_run_logger()
    tag_current_flow_run(flow_name)
    store, ctx, lineage = open_flow_run(config, flow_run.name or flow_name, flow_run.id, flow_run_url())
    parent = ctx.parent_run_id
    stages: dict[str, StageResult] = {}
    evals: dict[str, StageResult] = {}
    verdict = None
    try:
        sources = fingerprint_sources_task(config.ingest)
        corpus = stages["ingest"] = run_stage_task(ingest_task, store, ref=plan_ingest(store, config.ingest, sources),
                                                   ctx=ctx, cfg=config.ingest, sources=sources)
        if last >= 1:
            tok_cfg = config.tokenize
            if config.train.init_from and not tok_cfg.base_tokenizer:  # fine-tuning: the base model's tokenizer
                tok_cfg = tok_cfg.model_copy(update={"base_tokenizer": config.train.init_from})
            tokenizer = stages["tokenizer"] = run_stage_task(
                tokenizer_task, store, ref=plan_tokenizer(store, tok_cfg, corpus.ref), ctx=ctx, cfg=tok_cfg,
                corpus=corpus.ref)
            tokens = stages["tokenize"] = run_stage_task(
                tokenize_task, store, ref=plan_tokenize(store, tok_cfg, corpus.ref, tokenizer.ref), ctx=ctx,
                cfg=tok_cfg, corpus=corpus.ref, tokenizer=tokenizer.ref)
        if last >= 2:
            model = stages["train"] = run_stage_task(
                train_task, store, ref=plan_train(store, config.train, tokens.ref), ctx=ctx, cfg=config.train,
                tokens=tokens.ref, tokenizer=tokenizer.ref)
        if last >= 3:
            candidate = from_train_artifact(ctx, model.ref, model.model_id)
            evals = evaluate_model(ctx, store, config, candidate, corpus.ref)
            verdict = gate_against_champion(ctx, store, config, candidate, corpus.ref, evals)
    except BaseException:
        lineage.end_run(parent, failed=True)
        raise
    stages |= {f"eval:{k}": v for k, v in evals.items()}
    model_id = stages["train"].model_id if "train" in stages else None
    lineage.tag(parent, {**{f"codemill.{k}.status": v.status for k, v in stages.items()},
                         **{f"codemill.{k}.digest": v.ref.digest for k, v in stages.items()},
                         "codemill.until": until, **({"codemill.model_id": model_id} if model_id else {})})
    scores = scores_of(evals)
    lineage.log_metrics(parent, scores)
    publish_run_artifacts(store, lineage, parent, flow_run.name or flow_name, stages, scores, verdict)
    lineage.end_run(parent)
    for name, st in stages.items():
        logger.info("%-9s %-8s %s", name, st.status, st.ref.uri)
    return {
        "parent_run_id": parent,
        "experiment_id": lineage.experiment_id,
        "tracking_uri": config.mlflow_tracking_uri,
        "flow_run_id": str(flow_run.id) if flow_run.id else None,
        "model_id": model_id,
        "scores": scores,
        "gate": verdict,
        "stages": {k: v.model_dump(mode="json") for k, v in stages.items()},
    }


@flow(name="pipeline", flow_run_name=_run_name, persist_result=True, log_prints=True,
      on_failure=[record_failure_on_mlflow], on_crashed=[record_failure_on_mlflow])
def pipeline(config: PipelineConfig = PipelineConfig(), until: Stage = "evaluate") -> dict[str, Any]:  # noqa: B008
    """Corpus -> tokens -> checkpoint -> eval, stopping after ``until``. Each stage is skipped when its
    artifact digest is already in the store."""
    return run_pipeline(config, until, "pipeline")
