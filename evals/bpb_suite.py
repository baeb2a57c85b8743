"""The bpb suite: per-file rows over the val split and a bootstrap CI over files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch

from codemill.config import EvalConfig
from codemill.data.corpus import read_split
from codemill.data.tokenizer import EOS_TOKEN, PAD_TOKEN, load_tokenizer
from codemill.evals.bpb import file_nll, nats_to_bits
from codemill.evals.stats import bootstrap_ratio_ci

EVAL_CODE_VERSION = "eval-bpb-v1"


def load_val_files(corpus_dir: Path, max_files: int | None) -> pl.DataFrame:
    val = read_split(corpus_dir, "val").sort(["repo", "path"])
    if val.height == 0:
        raise ValueError(f"{corpus_dir}: the val split is empty; raise ingest.val_fraction or add sources")
    return val.head(max_files) if max_files else val


def score_bpb(model: torch.nn.Module, tokenizer_dir: Path, val: pl.DataFrame, cfg: EvalConfig,
              device: torch.device | None = None) -> tuple[pl.DataFrame, dict]:
    device = device or torch.device("cpu")
    tok = load_tokenizer(tokenizer_dir)
    encs = tok.encode_batch(val["content"].to_list(), add_special_tokens=False)
    ids = [e.ids for e in encs]
    model = model.to(device).eval()
    nll = file_nll(model, ids, bos_id=tok.token_to_id(EOS_TOKEN), pad_id=tok.token_to_id(PAD_TOKEN),
                   context_len=cfg.context_len, batch_size=cfg.batch_size, device=device)
    bits = np.array([nats_to_bits(x) for x in nll])
    n_bytes = val["bytes"].to_numpy().astype(np.float64)
    rows = pl.DataFrame({
        "item_id": [f"{r}/{p}" for r, p in zip(val["repo"], val["path"], strict=True)],
        "repo": val["repo"], "path": val["path"], "bytes": val["bytes"],
        "tokens": [len(x) for x in ids], "nll_bits": bits, "bpb": bits / n_bytes,
    })
    ci = bootstrap_ratio_ci(bits, n_bytes, samples=cfg.bootstrap_samples, confidence=cfg.confidence,
                            seed=cfg.seed)
    summary = {**ci.as_dict("val_bpb"), "files": ci.n_items, "bytes": int(n_bytes.sum()),
               "tokens": int(sum(len(x) for x in ids)), "confidence": cfg.confidence}
    return rows, summary
