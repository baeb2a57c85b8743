"""Corpus source kinds, one module each, registered here by ``kind``: each module's configs (``CorpusSource``
subclasses, listed in its ``SOURCES``) cut the source into chunks, read a chunk into raw rows and fingerprint the
source, and ``ingest.sources`` takes the discriminated union of the registered configs. Adding a kind is its
module plus its name in ``KIND_MODULES`` below.

- folder: files in sorted path order, cut at path-hash boundaries (incremental re-ingest redoes one chunk).
- parquet: one chunk per group of row groups; jsonl: one chunk per byte range, aligned to lines.
- hf_disk / hf_hub: one chunk per row range of the (memory-mapped) dataset.

The ingest calls this package's functions (``iter_chunks``, ``read_chunk``, ``source_fingerprint``), and the
problem sets list their files with ``table_files``; a chunk is read by the kind its spec names, so specs travel
to workers as plain data.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl

from codemill.data.folder_source import FolderRules
from codemill.data.sources.base import (
    RAW_SCHEMA,
    READ,
    ChunkSpec,
    CorpusSource,
    FileTableSource,
    SourceError,
    TableSource,
    stdlib_root,
)
from codemill.data.sources.folder import DEFAULT_LANGUAGES, FolderSource
from codemill.registry import plugins

KIND_MODULES = ("folder", "parquet", "jsonl", "hf")  # each module's SOURCES are registered
SOURCE_KINDS: dict[str, type[CorpusSource]] = {
    cfg.model_fields["kind"].default: cfg for configs in plugins(__name__, KIND_MODULES, "SOURCES") for cfg in configs}
DEFAULT_KIND = "folder"  # what a source without a `kind` is


def plan_chunks(index: int, src: CorpusSource, chunk_files: int,
                languages: Mapping[str, str] = DEFAULT_LANGUAGES) -> list[ChunkSpec]:
    return list(iter_chunks(index, src, chunk_files, languages))


def iter_chunks(index: int, src: CorpusSource, chunk_files: int,
                languages: Mapping[str, str] = DEFAULT_LANGUAGES) -> Iterator[ChunkSpec]:
    """``plan_chunks`` as the source is walked: each chunk as soon as it is known, so its work can start while
    the rest is planned (the same chunks, in the same order)."""
    return src.chunks(index, chunk_files, languages)


def read_chunk(spec: ChunkSpec, max_bytes: int) -> pl.DataFrame:
    """All rows of a chunk in RAW_SCHEMA, read by the kind the spec names; rows that cannot be taken carry their
    reason and no content."""
    return SOURCE_KINDS[spec.kind].read(spec, max_bytes)


def source_fingerprint(src: CorpusSource, languages: Mapping[str, str] = DEFAULT_LANGUAGES) -> dict[str, Any]:
    """What identifies a source's content, cheaply: file hashes (folder), ETag/size (URLs), dataset hash (HF)."""
    return src.fingerprint(languages)


def default_repo(src: CorpusSource) -> str:
    return src.default_repo()


def source_label(src: CorpusSource) -> str:
    return src.label()


def table_files(src: FileTableSource) -> list[str]:
    """Files of a parquet/jsonl source: a file, a folder (all files with the kind's extension), or a glob."""
    return src.files()


def folder_root(src: FolderSource) -> str:
    """The absolute root of a folder source (empty path = the stdlib); fails naming a missing path."""
    return src.root()


def folder_rules(src: FolderSource, languages: Mapping[str, str]) -> FolderRules:
    """The walk rules of a folder source (``FolderSource.rules``)."""
    return src.rules(languages)


__all__ = ["DEFAULT_KIND", "KIND_MODULES", "RAW_SCHEMA", "READ", "SOURCE_KINDS", "ChunkSpec", "CorpusSource",
           "FileTableSource", "FolderSource", "SourceError", "TableSource", "default_repo", "folder_root",
           "folder_rules", "iter_chunks", "plan_chunks", "read_chunk", "source_fingerprint", "source_label",
           "stdlib_root", "table_files"]
