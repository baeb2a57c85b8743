"""``parquet``: Parquet files with a text column, local or behind an fsspec URL; one chunk per group of row
groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import polars as pl

from codemill.data.sources.base import (
    HF_SETTINGS_AT_DEFAULTS,
    ChunkSpec,
    FileTableSource,
    SourceError,
    open_fs,
    table_rows,
)


class ParquetSource(FileTableSource):
    """Parquet files: a file, a folder (its `.parquet` files) or a glob, local or an fsspec URL such as
    s3://bucket/prefix/*.parquet."""

    DIGEST_COMPAT = dict(HF_SETTINGS_AT_DEFAULTS)
    EXTENSIONS = (".parquet",)

    kind: Literal["parquet"] = "parquet"

    def file_chunks(self, index: int, url: str, chunk_files: int, repo: str) -> list[ChunkSpec]:
        """Row groups in order, cut once a chunk holds ``chunk_files`` rows; fails on a file that is not
        Parquet or has no content column."""
        pf = open_parquet(url, self.storage_options, self.label())
        names = pf.schema_arrow.names
        if self.content_column not in names:
            raise SourceError(f"{self.label()}: {url} has no column {self.content_column!r} "
                              f"(columns: {', '.join(names)}); set content_column")
        batches: list[tuple[int, ...]] = []
        cur: list[int] = []
        n = 0
        for g in range(pf.num_row_groups):
            cur.append(g)
            n += pf.metadata.row_group(g).num_rows
            if n >= chunk_files:
                batches.append(tuple(cur))
                cur, n = [], 0
        if cur or not batches:
            batches.append(tuple(cur))
        return [ChunkSpec(index, self.kind, url, repo, groups, options=self.options()) for groups in batches]

    @classmethod
    def read(cls, spec: ChunkSpec, max_bytes: int) -> pl.DataFrame:
        """The chunk's row groups; a row without a path is named ``<file>#<row>``."""
        pf = open_parquet(spec.location, spec.options["storage_options"], spec.options["label"])
        table = pf.read_row_groups(list(spec.items)) if spec.items else pf.schema_arrow.empty_table()
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        first = sum(pf.metadata.row_group(g).num_rows for g in range(spec.items[0])) if spec.items else 0
        names = [f"{Path(spec.location).name}#{first + i}" for i in range(frame.height)]
        return table_rows(spec, frame, max_bytes, names)


def open_parquet(url: str, storage_options: dict[str, Any], label: str) -> Any:
    """The Parquet file at ``url``; a damaged file is a ``SourceError`` naming it."""
    import pyarrow.parquet as pq
    fs, path = open_fs(url, storage_options)
    try:
        return pq.ParquetFile(fs.open(path, "rb"))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise SourceError(f"{label}: {url} is not a readable Parquet file: {exc}") from exc


SOURCES = (ParquetSource,)
