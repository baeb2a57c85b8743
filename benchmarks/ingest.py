"""Ingest throughput per step, near-dedup against rensa and datasketch, the stage against read-and-hash, memory.

The corpus is one that exists on any machine: this Python's standard library including its site-packages
(every ``*.py`` file). In the same run the benchmark measures:

1. the per-step profile: every per-file step over the corpus, chunk by chunk, calling the stage's own step
   functions (``CHUNK_STEPS``) in one thread, wall and CPU seconds (CPU time is what load on a shared machine
   distorts least), MB/s and files/s;
2. near-dedup (``benchmarks.near_dedup``): codemill against rensa and datasketch on the same shingle hashes,
   permutations and bands, timed apart, with recall and precision against exact all-pairs Jaccard;
3. the whole stage (``run_ingest``, fresh chunk cache, default workers) in a fresh process, interleaved with a
   plain-Python baseline that walks, reads and SHA-256-hashes the same files (best of ``--stage-repeats``
   each): MB/s of both and their ratio, and the stage's own phases (planning, chunks, corpus-wide dedup,
   writing);
4. the stage's peak RSS (VmHWM: the one process, its chunk threads included) on the corpus and on 4 copies
   of it (four sources), each in a fresh process;
5. a datatrove pipeline doing comparable work on the same files (``benchmarks.datatrove_ingest``: reader,
   StarCoder filters, 10-gram decontamination, PII, 4-stage MinHash dedup, Parquet writer; as many tasks and
   workers as the stage has threads), in a fresh process, against the stage's best run above.

    python -m benchmarks.ingest [--dedup-files 4000] [--skip-scale] [--skip-dedup] [--skip-datatrove]
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
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks.near_dedup import compare
from codemill.cpus import usable_cpus
from codemill.data.config import IngestConfig
from codemill.data.dedup import resolve_duplicates
from codemill.data.filters import language_expr
from codemill.data.ingest import CHUNK_CODE_VERSION, CHUNK_STEPS, INGEST_CODE_VERSION, prepare
from codemill.data.minhash import VERIFY_MARGIN
from codemill.data.sources import FolderSource, plan_chunks, read_chunk, stdlib_root
from codemill.data.steps import ChunkContext


def corpus_source(repo: str | None = None) -> FolderSource:
    return FolderSource(path=stdlib_root(), repo=repo, include=["**/*.py"], exclude=[], skip_dirs=["__pycache__"])


def corpus_config(copies: int = 1) -> IngestConfig:
    return IngestConfig(sources=[corpus_source(f"copy{i}") for i in range(copies)])


class Clock:
    """Wall and CPU seconds per named step, summed over calls."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
        self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c
        return out


def per_step(cfg: IngestConfig) -> tuple[Clock, int, int, list[str]]:
    """Seconds per step over every chunk, run as ``process_chunk`` runs them (one thread); total bytes and
    files; the texts that passed (for the near-dedup comparison)."""
    proc = prepare(cfg)
    clock = Clock()
    specs = clock("plan (walk)", lambda: [s for i, src in enumerate(cfg.sources)
                                          for s in plan_chunks(i, src, cfg.chunk_files)])
    n_bytes = n_files = 0
    kept_texts: list[str] = []
    cands = []
    for c, spec in enumerate(specs):
        raw = clock("read", lambda spec=spec: read_chunk(spec, cfg.max_file_bytes).with_row_index("row"))
        n_bytes += int(raw["bytes"].sum())
        n_files += raw.height
        live = clock("language", lambda raw=raw: raw.filter(pl.col("reason").is_null()).with_columns(
            language_expr(pl.col("path"), cfg.languages).alias("language")))
        ctx = ChunkContext(proc)
        for step in CHUNK_STEPS:
            if step.name == "decontamination":  # the shared tokenisation, timed on its own
                clock("tokenize", lambda live=live, ctx=ctx: ctx.tokens(live))
            live = clock(step.name, lambda live=live, step=step, ctx=ctx: step.apply(live, ctx).filter(
                pl.col("reason").is_null()))
        cands.append(live.select(pl.col("row").cast(pl.Int64) + c * 10**6, "norm_hash", "bands", "sketch", "lsh_valid")
                     .rename({"row": "rank"}))
        kept_texts += live["content"].to_list()
    clock("corpus-wide dedup", lambda: resolve_duplicates(pl.concat(cands), near=True,
                                                          min_similarity=cfg.near_dedup.threshold - VERIFY_MARGIN))
    return clock, n_bytes, n_files, kept_texts


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


# Peak memory is VmHWM of the child's own address space (ru_maxrss would carry the parent's over exec); the
# chunk threads share it. The phases are timed from the stage's progress messages.
CHILD = """
import json, sys, tempfile, time
from pathlib import Path
from benchmarks.ingest import corpus_config
from codemill.data.ingest import run_ingest
cfg = corpus_config(int(sys.argv[1]))
marks = []
def say(msg):
    marks.append((msg.split(":")[0].split(" ")[0], time.perf_counter()))
with tempfile.TemporaryDirectory() as tmp:
    t0, c0 = time.perf_counter(), time.process_time()
    st = run_ingest(cfg, Path(tmp) / "out", progress=say)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
phases, prev = {}, ("start", t0)
for name, t in marks + [("end", t0 + dt)]:
    if name != prev[0]:
        phases[prev[0]] = phases.get(prev[0], 0.0) + t - prev[1]
        prev = (name, t)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"seconds": dt, "cpu_seconds": cpu, "files": st["files_seen"], "kept": st["files_kept"],
                  "peak_rss_mb": hwm / 1024, "phases": phases, "stats": st}))
"""


def stage_in_child(copies: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(copies)], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare_dedup(texts: list[str], cfg: IngestConfig, args: argparse.Namespace) -> None:
    """The near-dedup comparison of ``benchmarks.near_dedup`` on the first distinct texts the stage kept."""
    compare(list(dict.fromkeys(t for t in texts if t))[:args.dedup_files], cfg, args.repeats, args.quality_seeds)
    print()


def print_versions() -> None:
    libs = ", ".join(f"{lib} {version(lib)}" for lib in ("polars", "numpy", "pyarrow", "numba"))
    print(f"versions: python {sys.version.split()[0]}, {libs}; codemill {INGEST_CODE_VERSION} / "
          f"{CHUNK_CODE_VERSION}; {usable_cpus()} usable CPUs (the stage's default workers); "
          f"load average {os.getloadavg()[0]:.1f}")


def print_steps(clock: Clock, mb: float, n_files: int) -> None:
    print(f"per-step profile, one thread ({mb:.1f} MB, {n_files} files):")
    print(f"{'step':<20}{'wall s':>8}{'cpu s':>8}{'MB/s cpu':>10}{'files/s':>9}")
    for k, w in clock.wall.items():
        c = clock.cpu[k]
        print(f"{k:<20}{w:>8.2f}{c:>8.2f}{mb / max(c, 1e-9):>10.1f}{n_files / max(c, 1e-9):>9.0f}")
    w, c = sum(clock.wall.values()), sum(clock.cpu.values())
    print(f"{'sum of steps':<20}{w:>8.2f}{c:>8.2f}{mb / c:>10.1f}{n_files / c:>9.0f}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dedup-files", type=int, default=4000, help="files in the near-dedup comparison")
    ap.add_argument("--quality-seeds", type=int, default=10, help="near-dedup recall/precision over this many seeds")
    ap.add_argument("--repeats", type=int, default=3, help="near-dedup timings: best of this many, interleaved")
    ap.add_argument("--stage-repeats", type=int, default=2, help="whole stage and baseline: best of this many")
    ap.add_argument("--skip-scale", action="store_true", help="skip the 4x-corpus memory run")
    ap.add_argument("--skip-dedup", action="store_true", help="skip the near-dedup comparison")
    ap.add_argument("--only-dedup", action="store_true", help="only the near-dedup comparison")
    ap.add_argument("--skip-datatrove", action="store_true", help="skip the datatrove pipeline (~45 s here)")
    args = ap.parse_args()
    cfg = corpus_config()
    if args.only_dedup:
        texts = [t for spec in plan_chunks(0, cfg.sources[0], cfg.chunk_files)
                 for t in read_chunk(spec, cfg.max_file_bytes)["content"].drop_nulls().to_list()]
        return compare_dedup(texts, cfg, args)

    print_versions()
    clock, n_bytes, n_files, texts = per_step(cfg)
    mb = n_bytes / 1e6
    print(f"corpus: {n_files} files, {mb:.1f} MB ({stdlib_root()}, every *.py incl. site-packages)\n")
    print_steps(clock, mb, n_files)
    if not args.skip_dedup:
        compare_dedup(texts, cfg, args)

    t_base, one = float("inf"), None
    for _ in range(args.stage_repeats):  # interleaved, so a burst of load does not decide the ratio
        t, base_bytes = read_and_hash(cfg)
        t_base = min(t_base, t)
        run = stage_in_child(1)
        one = run if one is None or run["seconds"] < one["seconds"] else one
    assert one is not None
    base_mbs, stage_mbs = base_bytes / 1e6 / t_base, mb / one["seconds"]
    print(f"read-and-hash baseline (one thread, best of {args.stage_repeats}): {t_base:.2f} s ({base_mbs:.1f} MB/s)")
    print(f"whole stage (run_ingest, fresh cache, {usable_cpus()} workers, best of {args.stage_repeats}): "
          f"{one['seconds']:.2f} s wall, {one['cpu_seconds']:.2f} s CPU ({stage_mbs:.1f} MB/s, "
          f"{one['files'] / one['seconds']:.0f} files/s)")
    print(f"  stage / baseline throughput: {stage_mbs / base_mbs:.3f}x; phases (wall s): "
          + ", ".join(f"{k} {v:.2f}" for k, v in one["phases"].items()))
    st = one["stats"]
    print(f"  kept {st['files_kept']} of {st['files_seen']}; by reason {st['rejected_by_reason']}")
    print(f"  redactions {st['redactions']} in {st['redacted_files']} files; "
          f"decontaminated {len(st['decontamination']['dropped'])}")
    print(f"peak RSS 1x: {one['peak_rss_mb']:.0f} MB ({one['files']} files)")
    if not args.skip_scale:
        four = stage_in_child(4)
        print(f"peak RSS 4x: {four['peak_rss_mb']:.0f} MB ({four['files']} files, {four['seconds']:.1f} s); "
              f"4x / 1x = {four['peak_rss_mb'] / one['peak_rss_mb']:.2f}")
    if not args.skip_datatrove:
        compare_datatrove(one)
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB peak)")


def compare_datatrove(stage: dict) -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.datatrove_ingest", "--workers", str(usable_cpus()),
                          "--quiet"], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    dt = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"datatrove {dt['datatrove_version']} pipeline, same files ({usable_cpus()} tasks x workers): "
          f"{dt['wall_s']:.1f} s wall, {dt['cpu_s']:.1f} s CPU, kept {dt['files_kept']} of {dt['files']}")
    print(f"  codemill stage speed / datatrove: {dt['wall_s'] / stage['seconds']:.1f}x wall, "
          f"{dt['cpu_s'] / stage['cpu_seconds']:.1f}x CPU (> 1 means codemill is faster)")


if __name__ == "__main__":
    sys.exit(main())
