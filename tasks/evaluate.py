"""Prefect task of the evaluate stage: held-out bits-per-byte with a bootstrap CI, per-file rows stored."""

from __future__ import annotations

from typing import Any

import torch
from prefect import get_run_logger, task

from codemill import progress
from codemill.config import EvalConfig
from codemill.evals.bpb_suite import EVAL_CODE_VERSION, load_val_files, score_bpb
from codemill.hashing import stage_digest
from codemill.lineage import Lineage
from codemill.store import ArtifactRef, ArtifactStore, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, artifact_cache_key, run_stage

STAGE = "evaluate"
METRICS = ("val_bpb", "val_bpb_ci_low", "val_bpb_ci_high")


def plan_evaluate(store: ArtifactStore, cfg: EvalConfig, model: ArtifactRef, corpus: ArtifactRef,
                  tokens: ArtifactRef) -> ArtifactRef:
    inputs = {"model": model.digest, "corpus": corpus.digest, "tokens": tokens.digest}
    return store.ref(STAGE, "bpb", stage_digest(STAGE, EVAL_CODE_VERSION, cfg.digest_config(), inputs))


def val_dataset(corpus: ArtifactRef) -> ArtifactRef:
    """The val split, as a dataset: identified by the corpus digest it is a deterministic part of."""
    return ArtifactRef(stage=corpus.stage, name="corpus-val", digest=corpus.digest, uri=f"{corpus.uri}/val")


def _summary(m: Manifest) -> dict[str, Any]:
    return {k: m.stats[k] for k in (*METRICS, "files", "bytes", "model_id")}


def _record(corpus: ArtifactRef, model_id: str):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        lineage.log_params(run_id, {"evaluate": m.config})
        lineage.log_eval(run_id, model_id, val_dataset(corpus), {k: m.stats[k] for k in METRICS},
                         dataset_name="corpus-val")
        lineage.log_metrics(run_id, {"files": m.stats["files"], "bytes": m.stats["bytes"]})
        lineage.tag(run_id, {"codemill.model_id": model_id})
        return {"model_id": model_id}
    return record


@task(name="evaluate", cache_key_fn=artifact_cache_key, persist_result=True, cache_result_in_memory=False)
def evaluate_task(ref: ArtifactRef, ctx: RunContext, cfg: EvalConfig, model: ArtifactRef, model_id: str,
                  corpus: ArtifactRef, tokens: ArtifactRef) -> StageResult:
    from transformers import AutoModelForCausalLM

    logger = get_run_logger()
    store = ctx.store()

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        progress.sink().stage(STAGE, "scoring val files")
        val = load_val_files(store.local_path(corpus), cfg.max_files)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        lm = AutoModelForCausalLM.from_pretrained(str(store.local_path(model) / "hf"))
        rows, summary = score_bpb(lm, store.local_path(tokens) / "tokenizer", val, cfg, device)
        rows.write_parquet(w.path("rows/bpb.parquet"))
        logger.info("evaluate: val bpb %.4f [%.4f, %.4f] over %d files", summary["val_bpb"],
                    summary["val_bpb_ci_low"], summary["val_bpb_ci_high"], summary["files"])
        return w.finish(code_version=EVAL_CODE_VERSION, config=cfg.digest_config(),
                        inputs={"model": model, "corpus": corpus, "tokens": tokens},
                        stats={**summary, "model_id": model_id, "suite": "bpb"})

    return run_stage(ctx, ref, produce, _record(corpus, model_id), _summary)
