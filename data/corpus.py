"""The corpus layout: the row schema, the deterministic repo-level split and bounded Parquet shards."""

from __future__ import annotations

import hashlib
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from pathlib import Path

import polars as pl

from codemill.hashing import sha256_file

CORPUS_SCHEMA = {
    "repo": pl.String, "path": pl.String, "language": pl.String, "content": pl.String,
    "bytes": pl.Int64, "sha256": pl.String, "source_commit": pl.String, "split": pl.String,
    "redactions": pl.Int32,
}


def split_key(repo: str, path: str, unit: str) -> str:
    """The unit kept whole in one split: the repository, or its top-level package/module."""
    if unit == "repository":
        return repo
    top = path.split("/", 1)[0]
    if "/" not in path:
        top = top.rsplit(".", 1)[0]  # a top-level module `os.py` is its own unit `os`
    return f"{repo}/{top}"


def assign_split(key: str, val_fraction: float, salt: str) -> str:
    """Deterministic: a hash of the unit key mapped to [0, 1). Same key -> same split, on any machine."""
    h = hashlib.sha256(f"{salt}\0{key}".encode()).digest()
    u = int.from_bytes(h[:8], "big") / 2**64
    return "val" if u < val_fraction else "train"


class ParquetShardWriter:
    """Appends rows and cuts a Parquet shard whenever max_rows or max_bytes (of content) is reached.

    Holds at most one shard's rows, plus the shards still being written when given a ``pool``: compressing
    and hashing a shard then overlaps the next one's rows (at most ``in_flight`` at a time; a failed write
    is raised by the next ``add`` or by ``close``). Shards are named in order; ``close`` writes the rest (an
    empty shard when nothing was written, so every split has a readable file with the schema), waits for every
    write and returns per-shard stats.
    """

    def __init__(self, out_dir: Path, prefix: str, max_rows: int, max_bytes: int, unit: str = "repository",
                 pool: Executor | None = None, in_flight: int = 2) -> None:
        self.out_dir, self.prefix, self.max_rows, self.max_bytes = out_dir, prefix, max_rows, max_bytes
        self.unit, self.pool, self.in_flight = unit, pool, in_flight
        self.pending: list[pl.DataFrame] = []
        self.rows = self.bytes = 0
        self.shards: list[dict] = []
        self.writes: list[Future[str]] = []
        self.units: set[str] = set()
        out_dir.mkdir(parents=True, exist_ok=True)

    def add(self, df: pl.DataFrame) -> None:
        start = 0
        sizes = df["bytes"].to_list()
        for i, size in enumerate(sizes):
            if self.rows and (self.rows + 1 > self.max_rows or self.bytes + size > self.max_bytes):
                self.pending.append(df.slice(start, i - start))
                start = i
                self._flush()
            self.rows += 1
            self.bytes += size
        if start < df.height:
            self.pending.append(df.slice(start))

    def _flush(self) -> None:
        part = pl.concat(self.pending) if self.pending else pl.DataFrame(schema=CORPUS_SCHEMA)
        name = f"{self.prefix}-{len(self.shards):05d}.parquet"
        path = self.out_dir / name
        self.units.update(split_key(r, p, self.unit) for r, p in zip(part["repo"], part["path"], strict=True))
        self.shards.append({"file": f"{self.out_dir.name}/{name}", "rows": part.height,
                            "bytes": int(part["bytes"].sum())})
        if self.pool is None:
            done: Future[str] = Future()
            done.set_result(_write_and_hash(part, path))
            self.writes.append(done)
        else:
            waiting = [w for w in self.writes if not w.done()]
            if len(waiting) >= self.in_flight:
                wait(waiting, return_when=FIRST_COMPLETED)
            for w in self.writes:
                if w.done():
                    w.result()  # raises a failed write now, not after every other shard
            self.writes.append(self.pool.submit(_write_and_hash, part, path))
        self.pending, self.rows, self.bytes = [], 0, 0

    def close(self) -> list[dict]:
        if self.rows or not self.shards:
            self._flush()
        for shard, write in zip(self.shards, self.writes, strict=True):
            shard["sha256"] = write.result()
        return self.shards


def _write_and_hash(df: pl.DataFrame, path: Path) -> str:
    write_parquet_shard(df, path)
    return sha256_file(path)


def write_parquet_shard(df: pl.DataFrame, path: Path) -> None:
    df.write_parquet(path, compression="zstd", statistics=True)


def read_split(corpus_dir: Path, split: str) -> pl.DataFrame:
    files = sorted((corpus_dir / split).glob("*.parquet"))
    if not files:
        return pl.DataFrame(schema=CORPUS_SCHEMA)
    return pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed")
