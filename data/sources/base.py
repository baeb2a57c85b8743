"""What a corpus source kind is: a config (its ``kind`` names it) that cuts the source into chunks of work, reads
one chunk into raw rows, and fingerprints the source's content. One module per kind, registered in
``codemill.data.sources``.

A chunk is a picklable spec (so it can run on another worker) that reads into one Polars frame with the raw
schema below: every row the chunk saw, with ``reason`` set where the row could not be taken (binary, bad
encoding, a JSONL line that is not JSON, a null content, ...). Nothing is dropped without a reason. A spec names
its kind, and the registry finds the kind's reader from it, so a spec holds plain data only.

Whole-source problems (missing path, malformed Parquet, missing column, unreachable bucket, bad credentials)
raise ``SourceError`` naming the source and what is wrong.
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import polars as pl
from pydantic import Field

from codemill.data.folder_source import FOLDER_REASONS, decode_source
from codemill.data.steps import Step
from codemill.hashing import sha256_file
from codemill.stage_config import StageConfig, runtime_only

RAW_SCHEMA = {"source": pl.Int32, "repo": pl.String, "path": pl.String, "content": pl.String, "bytes": pl.Int64,
              "sha256": pl.String, "source_commit": pl.String, "reason": pl.String}
# Reading gives the first reasons: a folder's (files and walk) and a table's (rows that are not text).
READ = Step("read", (*FOLDER_REASONS, "invalid_json", "null_content", "not_text"))

# What one config shared by every kind hashed for a kind that had no use for it, at the only value that kind
# could give it (the field's default): the digest compatibility tables below are made of these.
TABLE_COLUMNS_AT_DEFAULTS: dict[str, Any] = {"content_column": "content", "path_column": "path",
                                             "repo_column": "repo"}
HF_SETTINGS_AT_DEFAULTS: dict[str, Any] = {"hf_name": None, "hf_split": "train", "hf_revision": None}


class SourceError(RuntimeError):
    """A whole source cannot be read: the message names the source and what is wrong."""


@dataclass(frozen=True)
class ChunkSpec:
    source: int
    kind: str  # the registered kind whose ``read`` reads it
    location: str  # folder root, file URL, or dataset path/name
    repo: str
    items: tuple[Any, ...] = ()  # folder: relative paths; parquet: row-group ids; jsonl/hf: (start, end)
    commit: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # what the kind's reader needs besides the location
    rejected: tuple[tuple[str, str], ...] = ()  # folder entries refused while walking: (path, reason)


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


class CorpusSource(StageConfig):
    """The base of a source kind's config (a ``kind: Literal[...]`` field names it) and what every kind does.

    ``DIGEST_COMPAT`` exists so that artifacts made before each kind had its own config keep their digests: one
    config used to serve every kind and hashed every kind's settings, so a kind's table holds the settings that
    config hashed and this kind lacks, at the only values this kind could give them; they join its digest. A
    kind added later has none."""

    DIGEST_COMPAT: ClassVar[dict[str, Any]] = {}

    kind: str
    path: str | None = Field(None, description="The folder, file, glob, fsspec URL or dataset to read.")
    repo: str | None = Field(None, description="Repository name for rows without a repo column; default: the "
                                               "folder or file name.")

    @property
    def is_stdlib(self) -> bool:
        """Whether this is the stdlib source (a folder source with an empty path)."""
        return False

    def label(self) -> str:
        """How messages name this source."""
        return f"{self.kind} source {self.path or stdlib_root()!r}"

    def default_repo(self) -> str:
        """The repository of rows that name none: ``repo``, else the last part of the path (before any glob)."""
        if self.repo:
            return self.repo
        return Path(str(self.path).rstrip("/")).name.split("*")[0] or "source"

    def chunks(self, index: int, chunk_files: int, languages: Mapping[str, str]) -> Iterator[ChunkSpec]:
        """The source (``index`` in ``ingest.sources``) cut into chunks of about ``chunk_files`` files or rows,
        each yielded as soon as it is known; ``languages`` is the ingest's language table."""
        raise NotImplementedError

    @classmethod
    def read(cls, spec: ChunkSpec, max_bytes: int) -> pl.DataFrame:
        """All rows of one of this kind's chunks in ``RAW_SCHEMA``; a row that cannot be taken carries its reason
        and no content (over ``max_bytes``: ``too_large``)."""
        raise NotImplementedError

    def fingerprint(self, languages: Mapping[str, str]) -> dict[str, Any]:
        """What identifies the source's content, cheaply (``root``, ``fingerprint``, ``files``, ``commit``): part
        of the ingest's digest, so a changed source must change it."""
        raise NotImplementedError

    def digest_config(self) -> dict[str, Any]:
        """The config's output-affecting fields, plus ``DIGEST_COMPAT``."""
        return {**self.DIGEST_COMPAT, **super().digest_config()}


class TableSource(CorpusSource):
    """A source whose rows are records with a content column (Parquet, JSONL, a Hugging Face dataset)."""

    content_column: str = Field("content", description="The column holding file text.")
    path_column: str | None = Field("path", description="File path column (absent = row-N).")
    repo_column: str | None = Field("repo", description="Repository column (absent = repo).")

    def options(self) -> dict[str, Any]:
        """What a chunk's reader needs from this config (``ChunkSpec.options``)."""
        return {"content_column": self.content_column, "path_column": self.path_column,
                "repo_column": self.repo_column, "label": self.label()}


class FileTableSource(TableSource):
    """A table kind read from files: a file, a folder (its files with the kind's ``EXTENSIONS``) or a glob, local
    or behind an fsspec URL such as s3://bucket/prefix/*.parquet."""

    EXTENSIONS: ClassVar[tuple[str, ...]] = ()

    storage_options: dict[str, Any] = runtime_only(
        default_factory=dict, description="fsspec options for URLs (e.g. S3 endpoint_url, key, secret); "
                                          "prefer environment credentials.")

    def options(self) -> dict[str, Any]:
        return {**super().options(), "storage_options": self.storage_options}

    def file_chunks(self, index: int, url: str, chunk_files: int, repo: str) -> list[ChunkSpec]:
        """The chunks of one of the source's files."""
        raise NotImplementedError

    def chunks(self, index: int, chunk_files: int, languages: Mapping[str, str]) -> Iterator[ChunkSpec]:
        repo = self.default_repo()
        specs = [spec for url in self.files() for spec in self.file_chunks(index, url, chunk_files, repo)]
        yield from specs  # every file is checked before the first chunk goes out

    def files(self) -> list[str]:
        """The source's files, sorted; fails naming a missing path, bucket or refused credentials."""
        label = self.label()
        try:
            fs, path = open_fs(str(self.path), self.storage_options)
            fs.invalidate_cache()  # fsspec instances are shared and cache listings; a re-ingest must see changes
            if any(c in path for c in "*?["):
                found = sorted(fs.glob(path))
            elif fs.isdir(path):
                found = sorted(p for p in fs.find(path) if p.endswith(self.EXTENSIONS))
            elif fs.exists(path):
                found = [path]
            else:
                raise SourceError(f"{label}: path does not exist")
        except SourceError:
            raise
        except PermissionError as exc:
            raise SourceError(f"{label}: access denied (check the credentials): {exc}") from exc
        except FileNotFoundError as exc:
            raise SourceError(f"{label}: not found (does the bucket exist?): {exc}") from exc
        except OSError as exc:
            raise SourceError(f"{label}: cannot list: {exc}") from exc
        if not found:
            raise SourceError(f"{label}: no files match")
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        return [p if protocol in ("file", "local") else f"{protocol}://{p}" for p in found]

    def fingerprint(self, languages: Mapping[str, str]) -> dict[str, Any]:
        """Each file's URL, size and ETag (a local file: its content hash)."""
        h = hashlib.sha256()
        files = self.files()
        for url in files:
            fs, path = open_fs(url, self.storage_options)
            info = fs.info(path)
            ident = info.get("ETag") or info.get("etag") or info.get("sha256") or _local_sha(fs, path, info)
            h.update(f"{url}\0{info.get('size')}\0{ident}\n".encode())
        return {"root": str(self.path), "fingerprint": h.hexdigest(), "files": len(files), "commit": None}


def open_fs(url: str, options: dict[str, Any]) -> Any:
    """The fsspec filesystem of ``url`` and the path on it."""
    import fsspec
    return fsspec.core.url_to_fs(url, **options)


def _local_sha(fs: Any, path: str, info: dict) -> str:
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "file" in protocols:
        return sha256_file(path)
    return f"mtime:{info.get('mtime') or info.get('LastModified')}"


# --- table rows: what every table kind's reader ends with ----------------------------------------------------
def table_rows(spec: ChunkSpec, frame: pl.DataFrame, max_bytes: int, fallback_paths: list[str],
               values: list[Any] | None = None) -> pl.DataFrame:
    """A table chunk's rows in ``RAW_SCHEMA``: the content, path and repository columns the source names
    (``values`` when the reader took the content itself), each cell that is not text given its reason."""
    opts = spec.options
    if values is None:
        if opts["content_column"] not in frame.columns:
            raise SourceError(f"{opts['label']}: {spec.location} has no column {opts['content_column']!r} "
                              f"(columns: {', '.join(frame.columns)}); set content_column")
        values = frame[opts["content_column"]].to_list()
    paths = _str_column(frame, opts["path_column"], fallback_paths)
    repos = _str_column(frame, opts["repo_column"], [spec.repo] * len(values))
    rows = []
    for v, p, r in zip(values, paths, repos, strict=True):
        text, n, sha, reason = _text_value(v, max_bytes)
        rows.append({"source": spec.source, "repo": r, "path": p, "content": text, "bytes": n, "sha256": sha,
                     "source_commit": spec.commit, "reason": reason})
    return pl.DataFrame(rows, schema=RAW_SCHEMA)


def _text_value(v: Any, max_bytes: int) -> tuple[str | None, int, str | None, str | None]:
    """(text, bytes, sha256, reason) for one cell of a content column."""
    if v is None:
        return None, 0, None, "null_content"
    raw = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v if isinstance(v, bytes) else None
    if raw is None:
        return None, 0, None, "not_text"
    sha = hashlib.sha256(raw).hexdigest()
    if len(raw) > max_bytes:
        return None, len(raw), sha, "too_large"
    text, reason = decode_source(raw)
    return text, len(raw), sha, reason


def _str_column(frame: pl.DataFrame, name: str | None, fallback: list[str]) -> list[str]:
    if not name or name not in frame.columns:
        return fallback
    vals = frame[name].cast(pl.String, strict=False).to_list()
    return [v if v else f for v, f in zip(vals, fallback, strict=True)]
