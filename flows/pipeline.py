"""The ``pipeline`` flow: ingest -> tokenize -> train -> evaluate, with one MLflow parent run per flow run."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.common import flow_run_url, open_flow_run, run_stage_task
from codemill.flows.evaluation import evaluate_model, gate_against_champion, scores_of
from codemill.tasks.ingest import fingerprint_sources_task, ingest_task, plan_ingest
from codemill.tasks.models import from_train_artifact
from codemill.tasks.tokenize import plan_tokenize, plan_tokenizer, tokenize_task, tokenizer_task
from codemill.tasks.train import plan_train, train_task


def _run_name() -> str:
    cfg = flow_run.parameters.get("config")
    name = cfg.name if isinstance(cfg, PipelineConfig) else (cfg or {}).get("name", "codemill")
    return f"{name}-{datetime.now(UTC):%Y%m%d-%H%M%S}"


@flow(name="pipeline", flow_run_name=_run_name, persist_result=True, log_prints=True)
def pipeline(config: PipelineConfig = PipelineConfig()) -> dict[str, Any]:  # noqa: B008
    """Corpus -> tokens -> checkpoint -> eval. Each stage is skipped when its artifact digest is in the store."""
    logger = get_run_logger()
    store, ctx, lineage = open_flow_run(config, flow_run.name or "pipeline", flow_run.id, flow_run_url())
    parent = ctx.parent_run_id
    try:
        sources = fingerprint_sources_task(config.ingest)
        corpus = run_stage_task(ingest_task, store, ref=plan_ingest(store, config.ingest, sources), ctx=ctx,
                                cfg=config.ingest, sources=sources)
        tok_cfg = config.tokenize
        if config.train.init_from and not tok_cfg.base_tokenizer:  # fine-tuning: the base model's tokenizer
            tok_cfg = tok_cfg.model_copy(update={"base_tokenizer": config.train.init_from})
        tokenizer = run_stage_task(tokenizer_task, store, ref=plan_tokenizer(store, tok_cfg, corpus.ref), ctx=ctx,
                                   cfg=tok_cfg, corpus=corpus.ref)
        tokens = run_stage_task(tokenize_task, store, ref=plan_tokenize(store, tok_cfg, corpus.ref, tokenizer.ref),
                                ctx=ctx, cfg=tok_cfg, corpus=corpus.ref, tokenizer=tokenizer.ref)
        model = run_stage_task(train_task, store, ref=plan_train(store, config.train, tokens.ref), ctx=ctx,
                               cfg=config.train, tokens=tokens.ref, tokenizer=tokenizer.ref)
        candidate = from_train_artifact(ctx, model.ref, model.model_id)
        evals = evaluate_model(ctx, store, config, candidate, corpus.ref)
        verdict = gate_against_champion(ctx, store, config, candidate, corpus.ref, evals)
    except BaseException:
        lineage.end_run(parent, failed=True)
        raise
    stages = {"ingest": corpus, "tokenizer": tokenizer, "tokenize": tokens, "train": model,
              **{f"eval:{k}": v for k, v in evals.items()}}
    lineage.tag(parent, {**{f"codemill.{k}.status": v.status for k, v in stages.items()},
                         **{f"codemill.{k}.digest": v.ref.digest for k, v in stages.items()},
                         "codemill.model_id": model.model_id})
    scores = scores_of(evals)
    lineage.log_metrics(parent, scores)
    lineage.end_run(parent)
    for name, st in stages.items():
        logger.info("%-9s %-8s %s", name, st.status, st.ref.uri)
    return {
        "parent_run_id": parent,
        "experiment_id": lineage.experiment_id,
        "tracking_uri": config.mlflow_tracking_uri,
        "flow_run_id": str(flow_run.id) if flow_run.id else None,
        "model_id": model.model_id,
        "scores": scores,
        "gate": verdict,
        "stages": {k: v.model_dump(mode="json") for k, v in stages.items()},
    }
