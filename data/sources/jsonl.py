"""``jsonl``: JSON-lines files with a text field, local or behind an fsspec URL (gzip read by extension); one
chunk per byte range, aligned to lines."""

from __future__ import annotations

import json
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

JSONL_RANGE_BYTES = 32 * 2**20


class JsonlSource(FileTableSource):
    """JSON-lines files: a file, a folder (its `.jsonl`, `.json` and `.jsonl.gz` files) or a glob, local or an
    fsspec URL."""

    DIGEST_COMPAT = dict(HF_SETTINGS_AT_DEFAULTS)
    EXTENSIONS = (".jsonl", ".json", ".jsonl.gz")

    kind: Literal["jsonl"] = "jsonl"

    def file_chunks(self, index: int, url: str, chunk_files: int, repo: str) -> list[ChunkSpec]:
        fs, path = open_fs(url, self.storage_options)
        size = fs.size(path)
        return [ChunkSpec(index, self.kind, url, repo, (s, min(s + JSONL_RANGE_BYTES, size)), options=self.options())
                for s in range(0, max(size, 1), JSONL_RANGE_BYTES)]

    @classmethod
    def read(cls, spec: ChunkSpec, max_bytes: int) -> pl.DataFrame:
        """Lines that start inside [start, end); a line that is not a JSON object is a row with a reason."""
        start, end = spec.items
        fs, path = open_fs(spec.location, spec.options["storage_options"])
        name = Path(spec.location).name
        records: list[dict | None] = []
        bad: list[tuple[int, str]] = []
        with fs.open(path, "rb", compression="infer") as fh:
            if start > 0:
                fh.seek(start - 1)
                fh.readline()  # finish the line that started before this range
            while fh.tell() < end or (start == end == 0):
                pos = fh.tell()
                line = fh.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    if not isinstance(obj, dict):
                        raise ValueError("not an object")
                    records.append(obj)
                except ValueError:
                    records.append(None)
                    bad.append((len(records) - 1, f"{name}@{pos}"))
        opts = spec.options
        content_col = opts["content_column"]
        if records and not any(r is not None and content_col in r for r in records):
            raise SourceError(f"{opts['label']}: {spec.location} has no field {content_col!r}; set content_column")
        meta = {c: pl.Series(c, [_as_str(r.get(c)) if r else None for r in records], dtype=pl.String)
                for c in (opts["path_column"], opts["repo_column"]) if c}
        frame = pl.DataFrame(list(meta.values())) if meta else pl.DataFrame()
        names = [f"{name}@{start}+{i}" for i in range(len(records))]
        out = table_rows(spec, frame, max_bytes, names, values=[r.get(content_col) if r else None for r in records])
        if bad:
            idx = [i for i, _ in bad]
            out = out.with_columns(pl.when(pl.int_range(pl.len()).is_in(idx)).then(pl.lit("invalid_json"))
                                   .otherwise(pl.col("reason")).alias("reason"))
        return out


def _as_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None if v is None else str(v)


SOURCES = (JsonlSource,)
