"""From scanned source files to the corpus table: exact dedup and the deterministic repo-level split."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import polars as pl

from codemill.data.local_source import SourceFile

CORPUS_SCHEMA = {
    "repo": pl.String, "path": pl.String, "language": pl.String, "content": pl.String,
    "bytes": pl.Int64, "sha256": pl.String, "source_commit": pl.String, "split": pl.String,
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


def build_corpus_table(files: Iterable[SourceFile], *, split_unit: str, val_fraction: float,
                       salt: str) -> tuple[pl.DataFrame, int]:
    """Rows sorted by (repo, path); exact duplicates (same content hash) dropped keeping the first.

    Returns the table and the number of duplicates removed.
    """
    rows = [
        {"repo": f.repo, "path": f.path, "language": f.language, "content": f.content, "bytes": f.bytes,
         "sha256": f.sha256, "source_commit": f.source_commit,
         "split": assign_split(split_key(f.repo, f.path, split_unit), val_fraction, salt)}
        for f in files
    ]
    df = pl.DataFrame(rows, schema=CORPUS_SCHEMA).sort(["repo", "path"])
    deduped = df.unique(subset=["sha256"], keep="first", maintain_order=True)
    return deduped, df.height - deduped.height


def write_shards(df: pl.DataFrame, out_dir: Path, prefix: str, max_rows: int) -> list[dict]:
    """Parquet shards of at most max_rows rows, named in order; returns per-shard stats."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = []
    for i, start in enumerate(range(0, max(df.height, 1), max_rows)):
        part = df.slice(start, max_rows)
        if part.height == 0 and i > 0:
            break
        name = f"{prefix}-{i:05d}.parquet"
        write_parquet_shard(part, out_dir / name)
        shards.append({"file": f"{out_dir.name}/{name}", "rows": part.height, "bytes": int(part["bytes"].sum())})
    return shards


def write_parquet_shard(df: pl.DataFrame, path: Path) -> None:
    df.write_parquet(path, compression="zstd", statistics=True)


def read_split(corpus_dir: Path, split: str) -> pl.DataFrame:
    files = sorted((corpus_dir / split).glob("*.parquet"))
    if not files:
        return pl.DataFrame(schema=CORPUS_SCHEMA)
    return pl.concat([pl.read_parquet(f) for f in files])
