"""Prefect tasks of the tokenizer and tokenize stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger

from codemill import progress
from codemill.config import TokenizeConfig
from codemill.data.tokenize_stage import TOKENIZE_CODE_VERSION, TOKENIZER_CODE_VERSION, build_tokenizer, run_tokenize
from codemill.hashing import stage_digest
from codemill.lineage import Lineage
from codemill.store import ArtifactRef, ArtifactStore, ArtifactWriter, Manifest
from codemill.tasks import fanout
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task
from codemill.tasks.models import folder_digest

TOKENIZER_KEYS = ("base_tokenizer", "vocab_size", "min_frequency")
TOKENS_KEYS = ("seq_len", "fim_rate", "fim_spm_rate", "seed")


def tokenizer_config(cfg: TokenizeConfig) -> dict[str, Any]:
    return {k: v for k, v in cfg.digest_config().items() if k in TOKENIZER_KEYS}


def plan_tokenizer(store: ArtifactStore, cfg: TokenizeConfig, corpus: ArtifactRef) -> ArtifactRef:
    """A trained tokenizer depends on the corpus; a base one on its files (local) or its name (hub)."""
    if cfg.base_tokenizer:
        local = Path(cfg.base_tokenizer).expanduser()
        inputs = {"base": folder_digest(local) if local.is_dir() else cfg.base_tokenizer}
    else:
        inputs = {"corpus": corpus.digest}
    return store.ref("tokenizer", "tokenizer",
                     stage_digest("tokenizer", TOKENIZER_CODE_VERSION, tokenizer_config(cfg), inputs))


def plan_tokenize(store: ArtifactStore, cfg: TokenizeConfig, corpus: ArtifactRef,
                  tokenizer: ArtifactRef) -> ArtifactRef:
    config = {k: v for k, v in cfg.digest_config().items() if k in TOKENS_KEYS}
    digest = stage_digest("tokenize", TOKENIZE_CODE_VERSION, config,
                          {"corpus": corpus.digest, "tokenizer": tokenizer.digest})
    return store.ref("tokenize", "tokens", digest)


def _record(inputs: dict[str, ArtifactRef], metric_keys: tuple[str, ...]):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        for name, ref in inputs.items():
            lineage.log_dataset_input(run_id, ref, "input", name=name)
        lineage.log_params(run_id, {m.stage: m.config})
        lineage.log_metrics(run_id, {k: m.stats[k] for k in metric_keys if isinstance(m.stats.get(k), int | float)})
        lineage.log_json(run_id, m.model_dump(mode="json"), "manifest.json")
        return {}
    return record


@stage_task("tokenizer")
def tokenizer_task(ref: ArtifactRef, ctx: RunContext, cfg: TokenizeConfig, corpus: ArtifactRef) -> StageResult:
    store = ctx.store()

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        progress.sink().stage("tokenizer", f"using {cfg.base_tokenizer}" if cfg.base_tokenizer else "training BPE")
        info = build_tokenizer(cfg, store.local_path(corpus), w.dir)
        return w.finish(code_version=TOKENIZER_CODE_VERSION, config=tokenizer_config(cfg),
                        inputs={} if cfg.base_tokenizer else {"corpus": corpus}, stats=info)

    inputs = {} if cfg.base_tokenizer else {"corpus": corpus}
    return run_stage(ctx, ref, produce, _record(inputs, ("vocab_size",)),
                     lambda m: {"vocab_size": m.stats["vocab_size"], "source": m.stats["source"]})


@stage_task("tokenize")
def tokenize_task(ref: ArtifactRef, ctx: RunContext, cfg: TokenizeConfig, corpus: ArtifactRef,
                  tokenizer: ArtifactRef) -> StageResult:
    logger = get_run_logger()
    store = ctx.store()
    keys = ("vocab_size", "tokens", "sequences", "seq_len", "bytes_per_token", "fim_documents")

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        progress.sink().stage("tokenize", "encoding and packing")
        stats = run_tokenize(cfg, store.local_path(corpus), store.local_path(tokenizer), w.dir,
                             progress=lambda done, total: progress.sink().update("tokenize", done, total),
                             mapper=fanout.mapper)
        logger.info("tokenize: %d files -> %d tokens, %d sequences of %d (%d FIM documents)", stats["files"],
                    stats["tokens"], stats["sequences"], stats["seq_len"], stats["fim_documents"])
        return w.finish(code_version=TOKENIZE_CODE_VERSION, config=cfg.digest_config(),
                        inputs={"corpus": corpus, "tokenizer": tokenizer}, stats=stats)

    return run_stage(ctx, ref, produce, _record({"corpus": corpus, "tokenizer": tokenizer}, keys),
                     lambda m: {k: m.stats[k] for k in keys})
