"""Ingest throughput per step, near-dedup against datasketch, the stage against read-and-hash, peak memory.

The corpus is one that exists on any machine: this Python's standard library including its site-packages
(every ``*.py`` file). In the same run the benchmark measures:

1. each per-file step over the corpus, chunk by chunk, as the stage runs it (MB/s and files/s);
2. near-dedup (``benchmarks.near_dedup``): codemill against rensa and datasketch on the same shingle hashes,
   permutations and bands, timed apart, with recall and precision against exact all-pairs Jaccard;
3. the whole stage (``run_ingest``, fresh chunk cache) against a plain-Python baseline that walks, reads and
   SHA-256-hashes the same files;
4. the stage's peak RSS on the corpus and on 4 copies of it (four sources), each in a fresh process.

    python -m benchmarks.ingest [--dedup-files 4000] [--skip-scale]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.near_dedup import compare
from codemill.config import IngestConfig, SourceConfig
from codemill.data.decontaminate import contamination_of
from codemill.data.dedup import normalized_hash, resolve_duplicates
from codemill.data.filters import apply_filters, language_expr
from codemill.data.ingest import prepare
from codemill.data.minhash import band_keys, signatures
from codemill.data.redact import redact_column
from codemill.data.shingles import ngrams_from_tokens, token_hashes
from codemill.data.sources import plan_chunks, read_chunk, stdlib_root


def corpus_source(repo: str | None = None) -> SourceConfig:
    return SourceConfig(path=stdlib_root(), repo=repo, include=["**/*.py"], exclude=[], skip_dirs=["__pycache__"])


def corpus_config(copies: int = 1) -> IngestConfig:
    return IngestConfig(sources=[corpus_source(f"copy{i}") for i in range(copies)])


def per_step(cfg: IngestConfig) -> tuple[dict[str, float], int, int, list[str]]:
    """Seconds per step over every chunk; total bytes and files; the texts that passed (for the dedup test)."""
    proc = prepare(cfg)
    t: dict[str, float] = dict.fromkeys(["read", "language+filters", "tokenize", "decontamination",
                                         "minhash+lsh bands", "redaction", "exact hash", "corpus-wide dedup"], 0.0)
    n_bytes = n_files = 0
    kept_texts: list[str] = []
    cands = []
    rank = 0
    for spec in [s for i, src in enumerate(cfg.sources) for s in plan_chunks(i, src, cfg.chunk_files)]:
        t0 = time.perf_counter()
        raw = read_chunk(spec, cfg.max_file_bytes)
        t1 = time.perf_counter()
        n_bytes += int(raw["bytes"].sum())
        n_files += raw.height
        live = raw.filter(pl.col("reason").is_null()).with_columns(language_expr(pl.col("path"), cfg.languages)
                                                                   .alias("language"))
        live = apply_filters(live, cfg.filters).filter(pl.col("reason").is_null())
        t2 = time.perf_counter()
        flat, lengths = token_hashes(live["content"])
        t3 = time.perf_counter()
        frac, _ = contamination_of(ngrams_from_tokens(flat, lengths, cfg.decontamination.ngram), proc.index)
        t4 = time.perf_counter()
        ng = ngrams_from_tokens(flat, lengths, cfg.near_dedup.ngram)
        keys = band_keys(signatures(ng, cfg.near_dedup.num_perm, cfg.near_dedup.seed), proc.bands, proc.rows)
        keep = frac < cfg.decontamination.threshold
        keys, valid = keys[keep], (lengths >= cfg.near_dedup.ngram)[keep]
        t5 = time.perf_counter()
        content, _ = redact_column(live["content"].filter(pl.Series(keep)), cfg.redaction)
        t6 = time.perf_counter()
        nh = normalized_hash(content)
        t7 = time.perf_counter()
        cands.append(pl.DataFrame({"rank": np.arange(rank, rank + len(content)), "norm_hash": nh,
                                   "bands": pl.Series(keys, dtype=pl.Array(pl.UInt64, proc.bands)),
                                   "lsh_valid": valid}))
        rank += len(content)
        kept_texts += content.to_list()
        for k, dt in zip(list(t)[:7], (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6), strict=True):
            t[k] += dt
    t0 = time.perf_counter()
    resolve_duplicates(pl.concat(cands), near=True)
    t["corpus-wide dedup"] = time.perf_counter() - t0
    return t, n_bytes, n_files, kept_texts


def read_and_hash(cfg: IngestConfig) -> tuple[float, int]:
    root = Path(stdlib_root())
    t0 = time.perf_counter()
    n = 0
    for _ in cfg.sources:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith(".py"):
                    p = os.path.join(dirpath, name)
                    try:
                        with open(p, "rb") as fh:
                            data = fh.read()
                    except OSError:
                        continue
                    hashlib.sha256(data).hexdigest()
                    n += len(data)
    return time.perf_counter() - t0, n


# Peak memory is VmHWM of the child's own address space: ru_maxrss would carry the parent's over exec.
CHILD = """
import json, sys, tempfile, time
from pathlib import Path
from benchmarks.ingest import corpus_config
from codemill.data.ingest import run_ingest
cfg = corpus_config(int(sys.argv[1]))
with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    st = run_ingest(cfg, Path(tmp) / "out")
    dt = time.perf_counter() - t0
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"seconds": dt, "files": st["files_seen"], "kept": st["files_kept"],
                  "peak_rss_mb": hwm / 1024, "stats": st}))
"""


def stage_in_child(copies: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(copies)], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare_dedup(texts: list[str], cfg: IngestConfig, args: argparse.Namespace) -> None:
    """The near-dedup comparison of ``benchmarks.near_dedup`` on the first distinct texts the stage kept."""
    compare(list(dict.fromkeys(t for t in texts if t))[:args.dedup_files], cfg, args.repeats, args.quality_seeds)
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dedup-files", type=int, default=4000, help="files in the datasketch comparison")
    ap.add_argument("--quality-seeds", type=int, default=5, help="near-dedup recall/precision over this many seeds")
    ap.add_argument("--repeats", type=int, default=3, help="near-dedup timings: best of this many, interleaved")
    ap.add_argument("--skip-scale", action="store_true", help="skip the 4x-corpus memory run")
    ap.add_argument("--only-dedup", action="store_true", help="only the near-dedup comparison")
    args = ap.parse_args()
    cfg = corpus_config()
    if args.only_dedup:
        texts = [t for spec in plan_chunks(0, cfg.sources[0], cfg.chunk_files)
                 for t in read_chunk(spec, cfg.max_file_bytes)["content"].drop_nulls().to_list()]
        return compare_dedup(texts, cfg, args)

    steps, n_bytes, n_files, texts = per_step(cfg)
    mb = n_bytes / 1e6
    print(f"corpus: {n_files} files, {mb:.1f} MB ({stdlib_root()}, every *.py incl. site-packages)\n")
    print(f"{'step':<22}{'seconds':>9}{'MB/s':>9}{'files/s':>10}")
    for k, dt in steps.items():
        print(f"{k:<22}{dt:>9.2f}{mb / dt:>9.1f}{n_files / dt:>10.0f}")
    tot = sum(steps.values())
    print(f"{'sum of steps':<22}{tot:>9.2f}{mb / tot:>9.1f}{n_files / tot:>10.0f}\n")

    compare_dedup(texts, cfg, args)
    t_base, base_bytes = read_and_hash(cfg)
    one = stage_in_child(1)
    print(f"read-and-hash baseline: {t_base:.2f} s ({base_bytes / 1e6 / t_base:.1f} MB/s)")
    print(f"whole stage (run_ingest, fresh cache): {one['seconds']:.2f} s ({mb / one['seconds']:.1f} MB/s, "
          f"{one['files'] / one['seconds']:.0f} files/s); stage / baseline = {one['seconds'] / t_base:.1f}x")
    st = one["stats"]
    print(f"  kept {st['files_kept']} of {st['files_seen']}; by reason {st['rejected_by_reason']}")
    print(f"  redactions {st['redactions']} in {st['redacted_files']} files; "
          f"decontaminated {len(st['decontamination']['dropped'])}")
    print(f"peak RSS 1x: {one['peak_rss_mb']:.0f} MB ({one['files']} files)")
    if not args.skip_scale:
        four = stage_in_child(4)
        print(f"peak RSS 4x: {four['peak_rss_mb']:.0f} MB ({four['files']} files, {four['seconds']:.1f} s); "
              f"4x / 1x = {four['peak_rss_mb'] / one['peak_rss_mb']:.2f}")
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB peak)")


if __name__ == "__main__":
    sys.exit(main())
