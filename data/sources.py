"""Corpus sources cut into chunks of work, and each chunk read into raw rows.

A chunk is a picklable spec (so it can run on another worker) that reads into one Polars frame with the raw
schema below: every row the chunk saw, with ``reason`` set where the row could not be taken (binary, bad
encoding, a JSONL line that is not JSON, a null content, ...). Nothing is dropped without a reason.

- folder: files in sorted path order, cut where a path's hash hits 0 mod ``chunk_files``; the cut points
  depend only on paths, so adding or editing one file changes only its chunk (incremental re-ingest).
- parquet: one chunk per group of row groups; jsonl: one chunk per byte range, aligned to lines.
- hf_disk / hf_hub: one chunk per row range of the (memory-mapped) dataset.
Whole-source problems (missing path, malformed Parquet, missing column, unreachable bucket, bad credentials)
raise ``SourceError`` naming the source and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from codemill.data.config import DEFAULT_LANGUAGES, SourceConfig, SourceKind
from codemill.data.folder_source import (
    FOLDER_REASONS,
    FolderRules,
    Rejections,
    check_source_root,
    decode_source,
    fingerprint_source,
    git_commit,
    iter_candidates,
    read_source_file,
)
from codemill.data.steps import Step
from codemill.hashing import sha256_file

RAW_SCHEMA = {"source": pl.Int32, "repo": pl.String, "path": pl.String, "content": pl.String, "bytes": pl.Int64,
              "sha256": pl.String, "source_commit": pl.String, "reason": pl.String}
JSONL_RANGE_BYTES = 32 * 2**20
MAX_CHUNK_FACTOR = 8  # a chunk is force-cut at this many times the mean size
# Reading gives the first reasons: a folder's (files and walk) and a table's (rows that are not text).
READ = Step("read", (*FOLDER_REASONS, "invalid_json", "null_content", "not_text"))


class SourceError(RuntimeError):
    """A whole source cannot be read: the message names the source and what is wrong."""


@dataclass(frozen=True)
class ChunkSpec:
    source: int
    kind: SourceKind
    location: str  # folder root, file URL, or dataset path/name
    repo: str
    items: tuple[Any, ...] = ()  # folder: relative paths; parquet: row-group ids; jsonl/hf: (start, end)
    commit: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    rejected: tuple[tuple[str, str], ...] = ()  # folder entries refused while walking: (path, reason)


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def source_label(src: SourceConfig) -> str:
    return f"{src.kind} source {src.path or stdlib_root()!r}"


def default_repo(src: SourceConfig) -> str:
    if src.repo:
        return src.repo
    if src.kind == "folder" and not src.path:
        return f"python{sys.version_info.major}.{sys.version_info.minor}-stdlib"
    return Path(str(src.path).rstrip("/")).name.split("*")[0] or "source"


def _fs(url: str, options: dict[str, Any]):
    import fsspec
    return fsspec.core.url_to_fs(url, **options)


def table_files(src: SourceConfig) -> list[str]:
    """Files of a parquet/jsonl source: a file, a folder (all files with the kind's extension), or a glob."""
    label = source_label(src)
    try:
        fs, path = _fs(str(src.path), src.storage_options)
        fs.invalidate_cache()  # fsspec instances are shared and cache listings; a re-ingest must see changes
        if any(c in path for c in "*?["):
            found = sorted(fs.glob(path))
        elif fs.isdir(path):
            ext = (".parquet",) if src.kind == "parquet" else (".jsonl", ".json", ".jsonl.gz")
            found = sorted(p for p in fs.find(path) if p.endswith(ext))
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


def _cut_points(paths: Iterable[str], mean: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for p in paths:
        chunk.append(p)
        h = int.from_bytes(hashlib.blake2b(p.encode(), digest_size=8).digest(), "big")
        if h % mean == 0 or len(chunk) >= mean * MAX_CHUNK_FACTOR:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def folder_root(src: SourceConfig) -> str:
    """The absolute root of a folder source (empty path = the stdlib); fails naming a missing path."""
    return str(check_source_root(Path(src.path).expanduser() if src.path else stdlib_root()).resolve())


def folder_rules(src: SourceConfig, languages: Mapping[str, str]) -> FolderRules:
    """The walk rules of a folder source; without include patterns it takes the extensions of ``languages``
    (the ingest's language table), so every file it takes gets a language."""
    return FolderRules(tuple(src.include or ()), tuple(src.exclude), tuple(src.skip_dirs), frozenset(languages))


def plan_chunks(index: int, src: SourceConfig, chunk_files: int,
                languages: Mapping[str, str] = DEFAULT_LANGUAGES) -> list[ChunkSpec]:
    return list(iter_chunks(index, src, chunk_files, languages))


def iter_chunks(index: int, src: SourceConfig, chunk_files: int,
                languages: Mapping[str, str] = DEFAULT_LANGUAGES) -> Iterator[ChunkSpec]:
    """``plan_chunks`` as the folder walk goes: each chunk as soon as its cut point is reached, so its work
    can start while the rest of the tree is walked (the same chunks, in the same order)."""
    repo = default_repo(src)
    if src.kind == "folder":
        root = folder_root(src)
        commit = git_commit(root)
        walk = Rejections()
        rels = iter_candidates(Path(root), folder_rules(src, languages), on_error=walk)
        opts = {"follow_external_symlinks": src.follow_external_symlinks}
        for c in _cut_points(rels, chunk_files):
            yield ChunkSpec(index, "folder", root, repo, tuple(c), commit, opts)
        if walk.entries:
            yield ChunkSpec(index, "folder", root, repo, (), commit, rejected=tuple(walk.entries))
        return
    yield from _table_chunks(index, src, chunk_files, repo)


def _table_chunks(index: int, src: SourceConfig, chunk_files: int, repo: str) -> list[ChunkSpec]:
    if src.kind in ("parquet", "jsonl"):
        specs = []
        for url in table_files(src):
            if src.kind == "parquet":
                specs += [ChunkSpec(index, "parquet", url, repo, groups, options=_table_options(src))
                          for groups in _row_group_batches(src, url, chunk_files)]
            else:
                fs, path = _fs(url, src.storage_options)
                size = fs.size(path)
                specs += [ChunkSpec(index, "jsonl", url, repo, (s, min(s + JSONL_RANGE_BYTES, size)),
                                    options=_table_options(src)) for s in range(0, max(size, 1), JSONL_RANGE_BYTES)]
        return specs
    n = len(open_hf(src))
    return [ChunkSpec(index, src.kind, str(src.path), repo, (s, min(s + chunk_files, n)), options=_table_options(src))
            for s in range(0, n, chunk_files)]


def _table_options(src: SourceConfig) -> dict[str, Any]:
    return {"content_column": src.content_column, "path_column": src.path_column, "repo_column": src.repo_column,
            "storage_options": src.storage_options, "hf_name": src.hf_name, "hf_split": src.hf_split,
            "hf_revision": src.hf_revision, "label": source_label(src)}


def _open_parquet(url: str, storage_options: dict[str, Any], label: str):
    import pyarrow.parquet as pq
    fs, path = _fs(url, storage_options)
    try:
        return pq.ParquetFile(fs.open(path, "rb"))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise SourceError(f"{label}: {url} is not a readable Parquet file: {exc}") from exc


def _row_group_batches(src: SourceConfig, url: str, rows: int) -> list[tuple[int, ...]]:
    pf = _open_parquet(url, src.storage_options, source_label(src))
    names = pf.schema_arrow.names
    if src.content_column not in names:
        raise SourceError(f"{source_label(src)}: {url} has no column {src.content_column!r} "
                          f"(columns: {', '.join(names)}); set content_column")
    batches, cur, n = [], [], 0
    for g in range(pf.num_row_groups):
        cur.append(g)
        n += pf.metadata.row_group(g).num_rows
        if n >= rows:
            batches.append(tuple(cur))
            cur, n = [], 0
    if cur or not batches:
        batches.append(tuple(cur))
    return batches


def open_hf(src_or_spec: SourceConfig | ChunkSpec):
    """The dataset behind an hf_disk / hf_hub source (memory-mapped Arrow; cheap to reopen in a worker)."""
    import datasets
    if isinstance(src_or_spec, SourceConfig):
        kind, path, opts = src_or_spec.kind, str(src_or_spec.path), _table_options(src_or_spec)
    else:
        kind, path, opts = src_or_spec.kind, src_or_spec.location, src_or_spec.options
    try:
        if kind == "hf_disk":
            ds = datasets.load_from_disk(path)
        else:
            ds = datasets.load_dataset(path, opts["hf_name"], split=opts["hf_split"], revision=opts["hf_revision"])
    except FileNotFoundError as exc:
        raise SourceError(f"{opts['label']}: not found: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - datasets raises many types; all mean "cannot load"
        raise SourceError(f"{opts['label']}: cannot load the dataset: {exc}") from exc
    if isinstance(ds, datasets.DatasetDict):
        if opts["hf_split"] not in ds:
            raise SourceError(f"{opts['label']}: no split {opts['hf_split']!r} (splits: {', '.join(ds)})")
        ds = ds[opts["hf_split"]]
    if opts["content_column"] not in ds.column_names:
        raise SourceError(f"{opts['label']}: no column {opts['content_column']!r} "
                          f"(columns: {', '.join(ds.column_names)}); set content_column")
    return ds


def hf_fingerprint(src: SourceConfig) -> str:
    return open_hf(src)._fingerprint


def read_chunk(spec: ChunkSpec, max_bytes: int) -> pl.DataFrame:
    """All rows of a chunk in RAW_SCHEMA; rows that cannot be taken carry their reason and no content."""
    if spec.kind == "folder":
        return _read_folder_chunk(spec, max_bytes)
    if spec.kind == "parquet":
        pf = _open_parquet(spec.location, spec.options["storage_options"], spec.options["label"])
        table = pf.read_row_groups(list(spec.items)) if spec.items else pf.schema_arrow.empty_table()
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        first = sum(pf.metadata.row_group(g).num_rows for g in range(spec.items[0])) if spec.items else 0
        names = [f"{Path(spec.location).name}#{first + i}" for i in range(frame.height)]
        return _table_rows(spec, frame, max_bytes, names)
    if spec.kind == "jsonl":
        return _read_jsonl_range(spec, max_bytes)
    start, end = spec.items
    ds = open_hf(spec).select(range(start, end))
    frame = pl.from_arrow(ds.data.table)
    assert isinstance(frame, pl.DataFrame)
    return _table_rows(spec, frame, max_bytes, [f"row-{i}" for i in range(start, end)])


def _row(spec: ChunkSpec, path: str, content: str | None, n: int, sha: str | None, reason: str | None) -> dict:
    return {"source": spec.source, "repo": spec.repo, "path": path, "content": content, "bytes": n, "sha256": sha,
            "source_commit": spec.commit, "reason": reason}


def _read_folder_chunk(spec: ChunkSpec, max_bytes: int) -> pl.DataFrame:
    """Column lists, not a dict per row: the frame is built in one pass per column."""
    paths: list[str] = []
    texts: list[str | None] = []
    sizes: list[int] = []
    shas: list[str | None] = []
    reasons: list[str | None] = []
    root, follow = os.path.realpath(spec.location), bool(spec.options.get("follow_external_symlinks"))
    for rel in spec.items:
        raw, reason = read_source_file(root, rel, max_bytes, follow)
        text = None
        if raw is not None:
            text, reason = decode_source(raw)
        paths.append(rel)
        texts.append(text)
        sizes.append(len(raw) if raw is not None else 0)
        shas.append(hashlib.sha256(raw).hexdigest() if raw is not None else None)
        reasons.append(reason)
    for rel, reason in spec.rejected:
        paths.append(rel)
        texts.append(None)
        sizes.append(0)
        shas.append(None)
        reasons.append(reason)
    n = len(paths)
    return pl.DataFrame({"source": [spec.source] * n, "repo": [spec.repo] * n, "path": paths, "content": texts,
                         "bytes": sizes, "sha256": shas, "source_commit": [spec.commit] * n, "reason": reasons},
                        schema=RAW_SCHEMA)


def _read_jsonl_range(spec: ChunkSpec, max_bytes: int) -> pl.DataFrame:
    """Lines that start inside [start, end); a line that is not a JSON object is a row with a reason."""
    start, end = spec.items
    fs, path = _fs(spec.location, spec.options["storage_options"])
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
    out = _table_rows(spec, frame, max_bytes, names,
                      values=[r.get(content_col) if r else None for r in records])
    if bad:
        idx = [i for i, _ in bad]
        out = out.with_columns(pl.when(pl.int_range(pl.len()).is_in(idx)).then(pl.lit("invalid_json"))
                               .otherwise(pl.col("reason")).alias("reason"))
    return out


def _as_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None if v is None else str(v)


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


def _table_rows(spec: ChunkSpec, frame: pl.DataFrame, max_bytes: int, fallback_paths: list[str],
                values: list[Any] | None = None) -> pl.DataFrame:
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
        row = _row(spec, p, text, n, sha, reason)
        row["repo"] = r
        rows.append(row)
    return pl.DataFrame(rows, schema=RAW_SCHEMA)


def _str_column(frame: pl.DataFrame, name: str | None, fallback: list[str]) -> list[str]:
    if not name or name not in frame.columns:
        return fallback
    vals = frame[name].cast(pl.String, strict=False).to_list()
    return [v if v else f for v, f in zip(vals, fallback, strict=True)]


def source_fingerprint(src: SourceConfig, languages: Mapping[str, str] = DEFAULT_LANGUAGES) -> dict[str, Any]:
    """What identifies a source's content, cheaply: file hashes (folder), ETag/size (URLs), dataset hash (HF)."""
    if src.kind == "folder":
        root = folder_root(src)
        digest, n = fingerprint_source(root, folder_rules(src, languages), src.follow_external_symlinks)
        return {"root": root, "fingerprint": digest, "files": n, "commit": git_commit(root)}
    if src.kind in ("parquet", "jsonl"):
        h = hashlib.sha256()
        files = table_files(src)
        for url in files:
            fs, path = _fs(url, src.storage_options)
            info = fs.info(path)
            ident = info.get("ETag") or info.get("etag") or info.get("sha256") or _local_sha(fs, path, info)
            h.update(f"{url}\0{info.get('size')}\0{ident}\n".encode())
        return {"root": str(src.path), "fingerprint": h.hexdigest(), "files": len(files), "commit": None}
    return {"root": str(src.path), "fingerprint": hf_fingerprint(src), "files": None, "commit": src.hf_revision}


def _local_sha(fs, path: str, info: dict) -> str:
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "file" in protocols:
        return sha256_file(path)
    return f"mtime:{info.get('mtime') or info.get('LastModified')}"


os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
