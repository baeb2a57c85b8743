"""The ingest stage as plain functions: chunks of raw rows -> filtered, redacted, decontaminated rows ->
corpus-wide exact and near dedup -> repo-level split -> bounded Parquet shards.

Memory stays bounded as the corpus grows: content is only ever held one chunk (or one output shard) at a
time; the corpus-wide steps see a few hundred bytes per file (hashes, LSH band keys, ranks). Each processed
chunk is cached under a digest of its input rows (paths and content hashes) and of the processing config,
so a re-ingest where few files changed re-does only their chunks.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import polars as pl

from codemill.cpus import usable_cpus
from codemill.data.config import IngestConfig
from codemill.data.corpus import CORPUS_SCHEMA, ParquetShardWriter, assign_split, split_key
from codemill.data.decontaminate import DECONTAMINATION, build_index, load_eval_texts
from codemill.data.dedup import EXACT_DEDUP, EXACT_HASH, MINHASH, NEAR_DEDUP, resolve_duplicates
from codemill.data.filters import FILTER, LANGUAGE, language_expr
from codemill.data.minhash import ALGORITHM as NEAR_DEDUP_ALGORITHM
from codemill.data.minhash import VERIFY_MARGIN as NEAR_DEDUP_VERIFY_MARGIN
from codemill.data.minhash import optimal_bands
from codemill.data.redact import PLACEHOLDERS, REDACTION
from codemill.data.sources import READ, ChunkSpec, default_repo, iter_chunks, read_chunk, source_fingerprint
from codemill.data.steps import ChunkContext, Processing, check_reasons, run_steps, step_of
from codemill.hashing import digest_of

# v2: 32-bit MinHash permutations; v3: steps as values, a row rejected before a step has nulls in its columns
# (a filtered file's contamination was 0.0, as if measured); v4: near-dedup signatures by one-permutation
# hashing. The near-dedup algorithm's own versioned name is part of both, so changing it re-runs the stage.
INGEST_CODE_VERSION = f"ingest-v4+{NEAR_DEDUP_ALGORITHM}"
CHUNK_CODE_VERSION = f"ingest-chunk-v4+{NEAR_DEDUP_ALGORITHM}"
# The ingest pipeline, in order: reading, the per-chunk steps, the corpus-wide dedup. The manifest counts each
# rejection under the step that declares its reason.
CHUNK_STEPS = (LANGUAGE, FILTER, DECONTAMINATION, MINHASH, REDACTION, EXACT_HASH)
STEPS = (READ, *CHUNK_STEPS, EXACT_DEDUP, NEAR_DEDUP)
LEDGER_COLUMNS = ["source", "repo", "path", "sha256", "bytes", "reason"]


class ChunkCache(Protocol):
    """Where processed chunks live between the passes (and across runs, for incremental re-ingest)."""

    def load(self, key: str) -> pl.DataFrame | None: ...

    def save(self, key: str, df: pl.DataFrame) -> None: ...


@dataclass(frozen=True)
class DirChunkCache:
    """Processed chunks as files under ``root``: zstd Parquet to keep, or (``throwaway``, the run's own cache,
    written and read once) uncompressed Arrow IPC, which costs a third of even LZ4 Parquet to write and read."""

    root: str
    throwaway: bool = False

    def _path(self, key: str) -> Path:
        return Path(self.root) / key[:2] / f"{key}.{'arrow' if self.throwaway else 'parquet'}"

    def load(self, key: str) -> pl.DataFrame | None:
        p = self._path(key)
        if not p.is_file():
            return None
        return pl.read_ipc(p) if self.throwaway else pl.read_parquet(p)

    def save(self, key: str, df: pl.DataFrame) -> None:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex}.tmp")  # unique across processes, unlike id()
        if self.throwaway:
            df.write_ipc(tmp, compression="uncompressed")
        else:
            df.write_parquet(tmp, compression="zstd")
        tmp.replace(p)  # atomic: a reader sees the whole chunk or none


@dataclass(frozen=True)
class ChunkResult:
    key: str
    reused: bool
    ledger: pl.DataFrame  # every row: LEDGER_COLUMNS + redaction counts, contamination
    candidates: pl.DataFrame  # rows that passed the per-file steps: row, norm_hash, bands, sketch, lsh_valid


def prepare(cfg: IngestConfig) -> Processing:
    bands, rows = optimal_bands(cfg.near_dedup.threshold, cfg.near_dedup.num_perm)
    index, eval_digest = None, None
    if cfg.decontamination.enabled:
        texts = load_eval_texts(cfg.decontamination)
        index, eval_digest = build_index(texts, cfg.decontamination.ngram), texts.digest()
    per_file = {k: v for k, v in cfg.digest_config().items() if k not in ("sources", "val_fraction", "split_unit",
                                                                          "split_salt", "shard_max_rows",
                                                                          "shard_max_bytes")}
    digest = digest_of({"code": CHUNK_CODE_VERSION, "config": per_file, "eval_texts": eval_digest,
                        "polars": pl.__version__, "bands": [bands, rows]})
    return Processing(cfg, bands, rows, index, digest)


def chunk_key(raw: pl.DataFrame, proc: Processing) -> str:
    h = hashlib.sha256(proc.digest.encode())
    for row in raw.select("source", "repo", "path", "sha256", "source_commit", "reason").iter_rows():
        h.update(repr(row).encode())
    return h.hexdigest()


def process_chunk(raw: pl.DataFrame, proc: Processing) -> pl.DataFrame:
    """The per-file steps over one chunk (``CHUNK_STEPS``); every row keeps its language, from its path."""
    check_reasons(raw.filter(pl.col("reason").is_not_null()), READ)
    df = raw.with_columns(language_expr(pl.col("path"), proc.cfg.languages).alias("language"))
    return run_steps(df, CHUNK_STEPS, ChunkContext(proc))


def work_chunk(spec: ChunkSpec, proc: Processing, cache: ChunkCache) -> ChunkResult:
    """Read a chunk, reuse its processed rows if cached, else process and cache them."""
    raw = read_chunk(spec, proc.cfg.max_file_bytes).with_row_index("row")
    key = chunk_key(raw, proc)
    done = cache.load(key)
    reused = done is not None
    if done is None:
        done = process_chunk(raw, proc)
        cache.save(key, done)
    extra = [c for c in done.columns if c.startswith("redact_")] + ["contamination", "contaminated_by", "language"]
    ledger = done.select(*LEDGER_COLUMNS, *[c for c in extra if c in done.columns])
    cands = done.filter(pl.col("reason").is_null()).select("row", "norm_hash", "bands", "sketch", "lsh_valid")
    return ChunkResult(key, reused, ledger, cands)


ChunkMapper = Callable[[Callable[[ChunkSpec], ChunkResult], Iterable[ChunkSpec]], Iterable[ChunkResult]]


def thread_mapper(workers: int) -> ChunkMapper:
    """``map`` over ``workers`` threads, results in chunk order. Threads, not processes: a chunk's work runs in
    Polars (Rust) and numpy, which release the GIL, and a thread starts at once where a fresh process pays
    seconds of imports; chunks are pure functions of their input, so the output is the same for any count."""
    def mapper(fn: Callable[[ChunkSpec], ChunkResult], items: Iterable[ChunkSpec]) -> Iterator[ChunkResult]:
        if workers <= 1:
            yield from map(fn, items)
            return
        pool = ThreadPoolExecutor(workers, thread_name_prefix="ingest-chunk")
        try:
            yield from pool.map(fn, items)  # submits each chunk as ``items`` yields it
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # a failed chunk stops the rest
    return mapper


def fingerprint_sources(cfg: IngestConfig) -> list[dict]:
    """Per source: location, repo and content fingerprint. Fails at once, naming the source, if unreadable."""
    return [{**source_fingerprint(s, cfg.languages), "repo": default_repo(s), "kind": s.kind} for s in cfg.sources]


def run_ingest(cfg: IngestConfig, out_dir: Path, cache: ChunkCache | None = None,
               progress: Callable[[str], None] | None = None, mapper: ChunkMapper | None = None) -> dict:
    """Write train/ and val/ shards plus audit tables under out_dir; return the stats for the manifest.

    Chunks go through ``mapper`` (Ray workers, say), else through ``cfg.workers`` threads (default: every
    usable CPU: affinity mask and cgroup quota)."""
    say = progress or (lambda _m: None)
    tmp = None
    if cache is None:
        tmp = tempfile.mkdtemp(prefix="codemill-chunks-")
        cache = DirChunkCache(tmp, throwaway=True)
    try:
        workers = cfg.workers or usable_cpus()
        return _run(cfg, out_dir, cache, say, mapper or thread_mapper(workers), workers)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(cfg: IngestConfig, out_dir: Path, cache: ChunkCache, say: Callable[[str], None], mapper: ChunkMapper,
         workers: int) -> dict:
    proc = prepare(cfg)
    def specs() -> Iterator[ChunkSpec]:  # chunks go to the workers while the sources are still walked
        for i, src in enumerate(cfg.sources):
            say(f"chunks: planning source {i}: {src.kind} {src.path or 'stdlib'}")
            yield from iter_chunks(i, src, cfg.chunk_files, cfg.languages)

    results = list(mapper(partial(work_chunk, proc=proc, cache=cache), specs()))
    say(f"chunks: {len(results)} processed")
    ledger = pl.concat([r.ledger.with_columns(pl.lit(c, pl.Int32).alias("chunk"), pl.int_range(pl.len()).alias("row"))
                        for c, r in enumerate(results)], how="diagonal_relaxed") if results else _empty_ledger()
    ledger = ledger.with_row_index("rank").with_columns(pl.col("rank").cast(pl.Int64))
    cands = pl.concat([r.candidates.with_columns(pl.lit(c, pl.Int32).alias("chunk")) for c, r in enumerate(results)])
    cands = cands.join(ledger.select("chunk", "row", "rank"), on=["chunk", "row"], how="left")
    say(f"corpus-wide dedup over {cands.height} files")
    drops = resolve_duplicates(cands.select("rank", "norm_hash", "bands", "sketch", "lsh_valid"),
                               cfg.near_dedup.enabled, cfg.near_dedup.threshold - NEAR_DEDUP_VERIFY_MARGIN)
    ledger = ledger.join(drops, on="rank", how="left", suffix="_dedup").with_columns(
        pl.coalesce("reason", "reason_dedup").alias("reason")).drop("reason_dedup").sort("rank")
    shards = _write_outputs(cfg, out_dir, results, ledger, cache, say, workers)
    return _stats(cfg, proc, ledger, results, shards, out_dir)


def _empty_ledger() -> pl.DataFrame:
    return pl.DataFrame(schema={"source": pl.Int32, "repo": pl.String, "path": pl.String, "sha256": pl.String,
                                "bytes": pl.Int64, "reason": pl.String, "chunk": pl.Int32, "row": pl.Int64})


def _write_outputs(cfg: IngestConfig, out_dir: Path, results: list[ChunkResult], ledger: pl.DataFrame,
                   cache: ChunkCache, say: Callable[[str], None], workers: int) -> dict[str, list[dict]]:
    """The kept rows of every chunk, in chunk order, into the split's shards. With ``workers`` > 1 the next
    chunks load while this one is split, and shards compress and hash while the next ones fill."""
    keep = ledger.filter(pl.col("reason").is_null()).select("chunk", "row")
    rows_of = {c: g["row"] for (c,), g in keep.group_by("chunk")}

    def kept_rows(c: int) -> pl.DataFrame | None:
        rows = rows_of.get(c)
        if rows is None:
            return None
        done = cache.load(results[c].key)
        if done is None:
            raise RuntimeError(f"processed chunk {results[c].key} vanished from the chunk cache during the run")
        part = done.filter(pl.col("row").is_in(rows.implode()))
        split = [assign_split(split_key(rp, p, cfg.split_unit), cfg.val_fraction, cfg.split_salt)
                 for rp, p in zip(part["repo"], part["path"], strict=True)]
        return part.with_columns(pl.Series("split", split, dtype=pl.String),
                                 pl.sum_horizontal(pl.col("^redact_.*$")).cast(pl.Int32).alias("redactions"))

    pool = ThreadPoolExecutor(workers, thread_name_prefix="ingest-write") if workers > 1 else None
    try:
        writers = {s: ParquetShardWriter(out_dir / s, s, cfg.shard_max_rows, cfg.shard_max_bytes, cfg.split_unit,
                                         pool=pool, in_flight=workers) for s in ("train", "val")}
        for c, part in enumerate(_prefetched(kept_rows, range(len(results)), pool, workers)):
            if c % 20 == 0:
                say(f"writing shards: chunk {c + 1}/{len(results)}")
            if part is not None:
                for s, w in writers.items():
                    w.add(part.filter(pl.col("split") == s).select(*CORPUS_SCHEMA))
        audit = ledger.drop("chunk", "row")
        audit.write_parquet(out_dir / "files.parquet", compression="zstd")
        shards = {s: w.close() for s, w in writers.items()}
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)  # after a failure: no write outlives the stage
    for s, w in writers.items():
        shards[s][0]["units"] = len(w.units)  # split units, counted over the whole split
    return shards


def _prefetched(fn: Callable[[int], Any], items: Iterable[int], pool: ThreadPoolExecutor | None,
                depth: int) -> Iterator[Any]:
    """``map(fn, items)`` with up to ``depth`` results computed ahead on ``pool`` (in order)."""
    if pool is None:
        yield from map(fn, items)
        return
    window: deque[Future[Any]] = deque()
    for item in items:
        window.append(pool.submit(fn, item))
        if len(window) > depth:
            yield window.popleft().result()
    while window:
        yield window.popleft().result()


def _stats(cfg: IngestConfig, proc: Processing, ledger: pl.DataFrame, results: list[ChunkResult],
           shards: dict[str, list[dict]], out_dir: Path) -> dict[str, Any]:
    rejected = ledger.filter(pl.col("reason").is_not_null())
    by_reason = rejected.group_by("reason").agg(pl.len().alias("files"), pl.col("bytes").sum().alias("bytes"))
    order = [s.name for s in STEPS]
    steps = sorted(({"step": step_of(r, STEPS).name, "reason": r, "files": int(f), "bytes": int(b)}
                    for r, f, b in by_reason.iter_rows()), key=lambda d: (order.index(d["step"]), d["reason"]))
    kept = ledger.filter(pl.col("reason").is_null())
    redactions = {p: int(ledger[f"redact_{p}"].sum()) for p in PLACEHOLDERS if f"redact_{p}" in ledger.columns}
    redacted_files = (int(kept.select(pl.sum_horizontal(pl.col("^redact_.*$")) > 0).to_series().sum())
                      if redactions else 0)
    contaminated = ledger.filter(pl.col("reason") == "contaminated").select(
        "repo", "path", "contamination", "contaminated_by") if "contaminated_by" in ledger.columns else None
    if contaminated is not None:
        contaminated.write_parquet(out_dir / "decontaminated.parquet")
    dups = ledger.filter(pl.col("reason").is_in(["exact_duplicate", "near_duplicate"])).join(
        ledger.select(pl.col("rank").alias("kept_rank"), pl.col("repo").alias("kept_repo"),
                      pl.col("path").alias("kept_path")), on="kept_rank", how="left").select(
        "repo", "path", "reason", "kept_repo", "kept_path")
    dups.write_parquet(out_dir / "duplicates.parquet")
    split_stats = {}
    for split, parts in shards.items():
        split_stats[split] = {"files": sum(p["rows"] for p in parts), "bytes": sum(p["bytes"] for p in parts),
                              "units": parts[0].pop("units")}
    per_source = []
    for i, src in enumerate(cfg.sources):
        s = ledger.filter(pl.col("source") == i)
        per_source.append({"kind": src.kind, "path": src.path, "seen": s.height,
                           "accepted": int(s["reason"].is_null().sum()),
                           "rejected": dict(sorted(Counter(s["reason"].drop_nulls().to_list()).items()))})
    return {
        "files_seen": ledger.height,
        "bytes_seen": int(ledger["bytes"].sum()),
        "files_kept": kept.height,
        "bytes_kept": int(kept["bytes"].sum()),
        "rejected_by_reason": {d["reason"]: d["files"] for d in steps},
        "steps": steps,
        "pipeline": [{"step": s.name, "reasons": list(s.reasons)} for s in STEPS],
        "rejected_examples": [[f"{r}/{p}", why] for r, p, why in
                              rejected.select("repo", "path", "reason").head(200).iter_rows()],
        "redactions": redactions,
        "redacted_files": redacted_files,
        "decontamination": {"eval_sets": [e.name for e in cfg.decontamination.eval_sets]
                            if cfg.decontamination.enabled else [],
                            "texts_too_short": proc.index.skipped_short if proc.index else 0,
                            "dropped": contaminated.head(100).to_dicts() if contaminated is not None else []},
        "near_dedup": {"enabled": cfg.near_dedup.enabled, "algorithm": NEAR_DEDUP_ALGORITHM,
                       "verified_at": cfg.near_dedup.threshold - NEAR_DEDUP_VERIFY_MARGIN,
                       "bands": proc.bands, "rows": proc.rows,
                       "num_perm": cfg.near_dedup.num_perm, "threshold": cfg.near_dedup.threshold,
                       "clusters": int(dups.filter(pl.col("reason") == "near_duplicate")["kept_path"].n_unique())},
        "chunks": {"total": len(results), "reused": sum(r.reused for r in results)},
        "splits": split_stats,
        "shards": shards,
        "sources": per_source,
    }


def diff_ledgers(previous: pl.DataFrame, current: pl.DataFrame) -> tuple[dict[str, int], pl.DataFrame]:
    """Files added, removed, modified (same repo/path, new content) and unchanged since a previous corpus."""
    key = ["repo", "path"]
    prev = previous.select(*key, pl.col("sha256").alias("old_sha256")).unique(key)
    cur = current.select(*key, "sha256").unique(key)
    j = cur.join(prev, on=key, how="full", coalesce=True)
    j = j.with_columns(pl.when(pl.col("old_sha256").is_null()).then(pl.lit("added"))
                       .when(pl.col("sha256").is_null()).then(pl.lit("removed"))
                       .when(pl.col("sha256") != pl.col("old_sha256")).then(pl.lit("modified"))
                       .otherwise(pl.lit("unchanged")).alias("change")).sort(key)
    counts = {c: int((j["change"] == c).sum()) for c in ("added", "removed", "modified", "unchanged")}
    return counts, j.filter(pl.col("change") != "unchanged")
