"""Tokenize stage vs the bare encode call it makes, like for like, in the same run.

Headline: the whole stage (read the Parquet shards, FIM, ``Tokenizer.encode_batch_fast``, pack rows with
positions, write .npy shards) against one bare ``encode_batch_fast`` call on the same texts with the same
tokenizer. With FIM off the texts are the documents; with FIM on they are the prefix/middle/suffix parts the
stage encodes (its own plans), so both sides encode exactly the same strings. The ratio is throughput, stage /
bare (1.0 = the stage costs nothing beyond its encode call; the target is >= 0.95). Each repeat runs the
reference and the stage back to back; the ratio is taken per repeat, and the median is the headline (the
machine's load drifts between repeats, less within one). ``encode_batch`` (with offsets) is shown for scale.

    python -m benchmarks.tokenize [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import polars as pl
from tokenizers import Tokenizer

from codemill.data.config import IngestConfig, TokenizeConfig
from codemill.data.ingest import run_ingest
from codemill.data.tokenize import DocumentEncoder, build_tokenizer, run_tokenize, train_shards
from codemill.data.tokenizer import load_tokenizer_info


def stage_texts(cfg: TokenizeConfig, corpus: Path, tok_dir: Path, tok: Tokenizer) -> list[str]:
    """Exactly the strings the stage hands to the encoder, in its order (FIM parts when FIM is on)."""
    encoder = DocumentEncoder(tok, load_tokenizer_info(tok_dir), cfg)
    out: list[str] = []
    for shard in train_shards(corpus):
        df = pl.read_parquet(shard, columns=["content", "sha256"])
        out += encoder.plan(df["content"].to_list(), df["sha256"].to_list())[1]
    return out


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()
    print("versions: " + ", ".join([f"python {platform.python_version()}"] + [
        f"{p} {version(p)}" for p in ("tokenizers", "numpy", "polars", "pyarrow", "codemill")]))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run_ingest(IngestConfig(val_fraction=0.0), root / "corpus")  # the stdlib, all in train
        base = TokenizeConfig(vocab_size=args.vocab, fim_rate=0.0)
        build_tokenizer(base, root / "corpus", root / "tokenizer")
        tok = Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json"))
        cases = {"FIM off": base, "FIM 0.5": base.model_copy(update={"fim_rate": 0.5})}
        texts = {name: stage_texts(cfg, root / "corpus", root / "tokenizer", tok) for name, cfg in cases.items()}
        docs = texts["FIM off"]
        n_bytes = sum(len(t.encode()) for t in docs)
        n_tokens = sum(len(e.ids) + 1 for e in tok.encode_batch_fast(docs, add_special_tokens=False))
        offsets: list[float] = []
        bare: dict[str, list[float]] = {name: [] for name in cases}
        stage: dict[str, list[float]] = {name: [] for name in cases}
        for r in range(args.repeats):
            offsets.append(timed(lambda: tok.encode_batch(docs, add_special_tokens=False)))
            for name, cfg in cases.items():
                bare[name].append(timed(lambda name=name: tok.encode_batch_fast(texts[name], add_special_tokens=False)))
                out = root / f"tokens-{r}-{cfg.fim_rate}"
                stage[name].append(timed(lambda cfg=cfg, out=out: run_tokenize(cfg, root / "corpus",
                                                                                root / "tokenizer", out)))
    print(f"corpus: {len(docs)} files, {n_bytes / 1e6:.1f} MB, {n_tokens:,} tokens (FIM off); "
          f"{args.repeats} repeats, medians")
    print(f"{'':<58} {'seconds':>8} {'MB/s':>7} {'stage/bare':>11}")
    for name in cases:
        b, s = statistics.median(bare[name]), statistics.median(stage[name])
        ratios = [bt / st for bt, st in zip(bare[name], stage[name], strict=True)]
        print(f"{f'reference: bare encode_batch_fast, stage texts ({name})':<58} {b:>8.2f} {n_bytes / b / 1e6:>7.2f}")
        print(f"{f'codemill tokenize stage, read+encode+pack+write ({name})':<58} {s:>8.2f} "
              f"{n_bytes / s / 1e6:>7.2f} {statistics.median(ratios):>10.2f}x")
        print(f"  per repeat: {' '.join(f'{x:.2f}' for x in ratios)}")
    o = statistics.median(offsets)
    print(f"{'for scale: bare encode_batch (with offsets), documents':<58} {o:>8.2f} {n_bytes / o / 1e6:>7.2f}")
    for name in cases:
        ratios = [bt / st for bt, st in zip(bare[name], stage[name], strict=True)]
        print(f"HEADLINE ({name}): tokenize stage / bare Tokenizer.encode_batch_fast on the same texts = "
              f"{statistics.median(ratios):.2f}x (target >= 0.95)")


if __name__ == "__main__":
    main()
