"""Prefect task of the tokenize stage."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from codemill import progress
from codemill.config import TokenizeConfig
from codemill.data.tokenize_stage import TOKENIZE_CODE_VERSION, run_tokenize
from codemill.hashing import stage_digest
from codemill.lineage import Lineage
from codemill.store import ArtifactRef, ArtifactStore, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, artifact_cache_key, run_stage

STAGE = "tokenize"


def plan_tokenize(store: ArtifactStore, cfg: TokenizeConfig, corpus: ArtifactRef) -> ArtifactRef:
    digest = stage_digest(STAGE, TOKENIZE_CODE_VERSION, cfg.digest_config(), {"corpus": corpus.digest})
    return store.ref(STAGE, "tokens", digest)


def _summary(m: Manifest) -> dict[str, Any]:
    keys = ("vocab_size", "tokens", "sequences", "seq_len", "bytes_per_token")
    return {k: m.stats[k] for k in keys}


def _record(corpus: ArtifactRef):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        lineage.log_dataset_input(run_id, corpus, "input", name="corpus")
        lineage.log_params(run_id, {"tokenize": m.config})
        lineage.log_metrics(run_id, {k: v for k, v in _summary(m).items() if isinstance(v, int | float)})
        lineage.log_json(run_id, m.model_dump(mode="json"), "manifest.json")
        return {}
    return record


@task(name="tokenize", cache_key_fn=artifact_cache_key, persist_result=True, cache_result_in_memory=False)
def tokenize_task(ref: ArtifactRef, ctx: RunContext, cfg: TokenizeConfig, corpus: ArtifactRef) -> StageResult:
    logger = get_run_logger()
    store = ctx.store()

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        corpus_dir = store.local_path(corpus)
        progress.sink().stage(STAGE, "training BPE tokenizer")
        stats = run_tokenize(cfg, corpus_dir, w.dir,
                             progress=lambda done, total: progress.sink().update(STAGE, done, total))
        logger.info("tokenize: %d files -> %d tokens, %d sequences of %d", stats["files"], stats["tokens"],
                    stats["sequences"], stats["seq_len"])
        return w.finish(code_version=TOKENIZE_CODE_VERSION, config=cfg.digest_config(),
                        inputs={"corpus": corpus}, stats=stats)

    return run_stage(ctx, ref, produce, _record(corpus), _summary)
