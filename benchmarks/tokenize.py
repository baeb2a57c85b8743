"""Tokenize stage throughput vs a bare ``Tokenizer.encode_batch`` over the same texts, in the same run.

The stage (FIM off, to compare like with like, and FIM on) streams the corpus shards, encodes with the Rust
batch encoder, packs rows with positions and writes .npy shards. The reference only encodes.

    python -m benchmarks.tokenize [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import polars as pl
from tokenizers import Tokenizer

from codemill.config import IngestConfig, TokenizeConfig
from codemill.data.ingest import run_ingest
from codemill.data.tokenize import build_tokenizer, run_tokenize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run_ingest(IngestConfig(val_fraction=0.0), root / "corpus")  # the stdlib, all in train
        base = TokenizeConfig(vocab_size=args.vocab, fim_rate=0.0)
        build_tokenizer(base, root / "corpus", root / "tokenizer")
        tok = Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json"))
        texts = [t for f in sorted((root / "corpus" / "train").glob("*.parquet"))
                 for t in pl.read_parquet(f, columns=["content"])["content"].to_list()]
        n_bytes = sum(len(t.encode()) for t in texts)
        bare, bare_fast, stage, stage_fim = [], [], [], []
        n_tokens = 0
        for r in range(args.repeats):
            t0 = time.perf_counter()
            n_tokens = sum(len(e.ids) + 1 for e in tok.encode_batch(texts, add_special_tokens=False))
            bare.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tok.encode_batch_fast(texts, add_special_tokens=False)  # no offsets: what the stage calls
            bare_fast.append(time.perf_counter() - t0)
            for cfg, sink in ((base, stage), (base.model_copy(update={"fim_rate": 0.5}), stage_fim)):
                out = root / f"tokens-{r}-{cfg.fim_rate}"
                t0 = time.perf_counter()
                run_tokenize(cfg, root / "corpus", root / "tokenizer", out)
                sink.append(time.perf_counter() - t0)
    b, bf = statistics.median(bare), statistics.median(bare_fast)
    s, sf = statistics.median(stage), statistics.median(stage_fim)
    print(f"corpus: {len(texts)} files, {n_bytes / 1e6:.1f} MB, {n_tokens:,} tokens; median of {args.repeats}")
    print(f"{'':<48} {'seconds':>8} {'tokens/s':>12} {'ratio':>6}")
    print(f"{'reference: Tokenizer.encode_batch (bare)':<48} {b:>8.2f} {n_tokens / b:>12,.0f} {1.0:>6.2f}")
    print(f"{'reference: Tokenizer.encode_batch_fast (bare)':<48} {bf:>8.2f} {n_tokens / bf:>12,.0f} {b / bf:>6.2f}")
    print(f"{'codemill tokenize stage (read+encode+pack+write)':<48} {s:>8.2f} {n_tokens / s:>12,.0f} "
          f"{b / s:>6.2f}")
    print(f"{'codemill tokenize stage, FIM 0.5':<48} {sf:>8.2f} {n_tokens / sf:>12,.0f} {b / sf:>6.2f}")
    print(f"stage / bare encode_batch throughput: {b / s:.2f}x (target >= 0.8x); "
          f"stage / bare encode_batch_fast: {bf / s:.2f}x")


if __name__ == "__main__":
    main()
