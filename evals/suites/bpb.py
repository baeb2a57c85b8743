"""Bits per byte on the val split: the model's code-modelling loss, comparable across tokenizers."""

from __future__ import annotations

import numpy as np
import polars as pl
from pydantic import Field

from codemill.evals.stats import ItemScores
from codemill.evals.suites.base import Metric, Rows, Suite, SuiteRun, ci, scores
from codemill.stage_config import StageConfig, runtime_only


class BpbSuiteConfig(StageConfig):
    max_files: int | None = Field(400, description="Score at most this many val files (sorted by path).")
    context_len: int = Field(256, ge=8, description="Tokens per scoring window.")
    batch_size: int = runtime_only(default=16, gt=0, description="Windows per forward pass.")


# Bits per byte are not a 0-1 rate: its hold floor is its own. The noisiest shipped preset is the one with the
# largest seed SD of bits per byte.
VAL_BPB = Metric("val_bpb", higher_is_better=False, hold_margin=0.12, noise_yardstick=True)


def run(r: SuiteRun) -> Rows:
    from codemill.evals.bpb import bits_per_byte, file_nll, nats_to_bits

    cfg, m = r.cfg, r.model
    val, clusters = r.val(cfg.bpb.max_files)
    texts = val["content"].to_list()
    ids = m.tokenizer(texts, add_special_tokens=False)["input_ids"]
    nll = file_nll(m.model, ids, bos_id=m.bos_id, pad_id=m.tokenizer.pad_token_id,
                   context_len=cfg.bpb.context_len, batch_size=cfg.bpb.batch_size, device=m.device)
    bits = np.array([nats_to_bits(x) for x in nll])
    n_bytes = val["bytes"].to_numpy().astype(np.float64)
    rows = pl.DataFrame({
        "item_id": [f"{rp}/{p}" for rp, p in zip(val["repo"], val["path"], strict=True)], "cluster": clusters,
        "bytes": val["bytes"], "tokens": [len(x) for x in ids], "nll_bits": bits,
        "bpb": [bits_per_byte(x, int(b)) for x, b in zip(nll, n_bytes, strict=True)]})
    summary = {**ci(bits, n_bytes, np.array(clusters), cfg, VAL_BPB.name), "files": rows.height,
               "clusters": len(set(clusters)), "bytes": int(n_bytes.sum()), "tokens": int(rows["tokens"].sum())}
    return rows, summary


def item_scores(rows: pl.DataFrame) -> dict[str, ItemScores]:
    return {VAL_BPB.name: scores(rows, VAL_BPB, "nll_bits", rows["bytes"].to_numpy().astype(float))}


SUITE = Suite("bpb", "eval-bpb-v2", run, item_scores, (VAL_BPB,), settings=BpbSuiteConfig)
