"""Prefect tasks of the tokenizer and tokenize stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger

from codemill import progress
from codemill.data.config import TokenizeConfig
from codemill.data.tokenize import TOKENIZE_CODE_VERSION, TOKENIZER_CODE_VERSION, build_tokenizer, run_tokenize
from codemill.lineage import Lineage
from codemill.plan import StagePlan, external_input
from codemill.store import ArtifactRef, ArtifactWriter, Manifest
from codemill.tasks import fanout
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task
from codemill.tasks.resolve_model import folder_digest

TOKENIZER_KEYS = ("base_tokenizer", "vocab_size", "min_frequency")
TOKENS_KEYS = ("seq_len", "fim_rate", "fim_spm_rate", "seed")


def tokenizer_config(cfg: TokenizeConfig) -> dict[str, Any]:
    return {k: v for k, v in cfg.digest_config().items() if k in TOKENIZER_KEYS}


def plan_tokenizer(cfg: TokenizeConfig, corpus: ArtifactRef) -> StagePlan:
    """A trained tokenizer depends on the corpus; a base one on its files (local) or its name (hub)."""
    config = tokenizer_config(cfg)
    if cfg.base_tokenizer:
        local = Path(cfg.base_tokenizer).expanduser()
        base = folder_digest(local) if local.is_dir() else cfg.base_tokenizer
        inputs = {"base": external_input("base-tokenizer", local.name, base, cfg.base_tokenizer)}
    else:
        inputs = {"corpus": corpus}
    return StagePlan(stage="tokenizer", name="tokenizer", code_version=TOKENIZER_CODE_VERSION,
                     config=config, inputs=inputs)


def plan_tokenize(cfg: TokenizeConfig, corpus: ArtifactRef, tokenizer: ArtifactRef) -> StagePlan:
    config = {k: v for k, v in cfg.digest_config().items() if k in TOKENS_KEYS}
    return StagePlan(stage="tokenize", name="tokens", code_version=TOKENIZE_CODE_VERSION, config=config,
                     inputs={"corpus": corpus, "tokenizer": tokenizer})


def _record(plan: StagePlan, metric_keys: tuple[str, ...]):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        for name, ref in plan.inputs.items():
            if name != "base":
                lineage.log_dataset_input(run_id, ref, "input", name=name)
        lineage.log_metrics(run_id, {k: m.stats[k] for k in metric_keys if isinstance(m.stats.get(k), int | float)})
        return {}
    return record


@stage_task("tokenizer")
def tokenizer_task(plan: StagePlan, ctx: RunContext, cfg: TokenizeConfig) -> StageResult:
    store = ctx.store()

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        progress.sink().stage("tokenizer", f"using {cfg.base_tokenizer}" if cfg.base_tokenizer else "training BPE")
        corpus_dir = None if cfg.base_tokenizer else store.local_path(plan.input("corpus"))
        return w.finish(build_tokenizer(cfg, corpus_dir, w.dir))

    return run_stage(ctx, plan, produce, _record(plan, ("vocab_size",)),
                     lambda m: {"vocab_size": m.stats["vocab_size"], "source": m.stats["source"]})


@stage_task("tokenize")
def tokenize_task(plan: StagePlan, ctx: RunContext, cfg: TokenizeConfig) -> StageResult:
    logger = get_run_logger()
    store = ctx.store()
    keys = ("vocab_size", "tokens", "sequences", "seq_len", "bytes_per_token", "fim_documents")

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        progress.sink().stage("tokenize", "encoding and packing")
        stats = run_tokenize(cfg, store.local_path(plan.input("corpus")), store.local_path(plan.input("tokenizer")),
                             w.dir,
                             progress=lambda done, total: progress.sink().update("tokenize", done, total),
                             mapper=fanout.mapper)
        logger.info("tokenize: %d files -> %d tokens, %d sequences of %d (%d FIM documents)", stats["files"],
                    stats["tokens"], stats["sequences"], stats["seq_len"], stats["fim_documents"])
        return w.finish(stats)

    return run_stage(ctx, plan, produce, _record(plan, keys),
                     lambda m: {k: m.stats[k] for k in keys})
