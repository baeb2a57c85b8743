"""The ingest stage as one pure function: sources -> rejected-by-reason counts -> dedup -> split -> shards."""

from __future__ import annotations

import sys
import sysconfig
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from codemill.config import IngestConfig, SourceConfig
from codemill.data.corpus import build_corpus_table, split_key, write_shards
from codemill.data.local_source import check_source_root, fingerprint_source, git_commit, scan_source

INGEST_CODE_VERSION = "ingest-v1"


@dataclass(frozen=True)
class ResolvedSource:
    root: str
    repo: str
    include: tuple[str, ...]
    exclude: tuple[str, ...]


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def resolve_source(src: SourceConfig) -> ResolvedSource:
    if src.path:
        root = str(check_source_root(Path(src.path).expanduser()).resolve())
        repo = src.repo or Path(root).name
    else:
        root = stdlib_root()
        repo = src.repo or f"python{sys.version_info.major}.{sys.version_info.minor}-stdlib"
    return ResolvedSource(root=root, repo=repo, include=tuple(src.include), exclude=tuple(src.exclude))


def fingerprint_sources(cfg: IngestConfig) -> list[dict]:
    """Per source: root, repo and content fingerprint. Fails at once, naming the path, if a root is missing."""
    out = []
    for src in (resolve_source(s) for s in cfg.sources):
        digest, n = fingerprint_source(src.root, list(src.include), list(src.exclude))
        out.append({"root": src.root, "repo": src.repo, "fingerprint": digest, "files": n,
                    "commit": git_commit(src.root)})
    return out


def run_ingest(cfg: IngestConfig, out_dir: Path,
               progress: Callable[[str], None] | None = None) -> dict:
    """Write train/ and val/ Parquet shards under out_dir; return the stats that go into the manifest."""
    rejected: Counter[str] = Counter()
    examples: list[tuple[str, str]] = []
    files = []
    seen = 0
    per_source = []
    for src in (resolve_source(s) for s in cfg.sources):
        if progress:
            progress(f"scanning {src.root}")
        commit = git_commit(src.root)
        scan = scan_source(src.root, src.repo, list(src.include), list(src.exclude), cfg.max_file_bytes, commit)
        seen += scan.seen
        rejected.update(scan.rejected)
        examples.extend((f"{src.repo}/{p}", r) for p, r in scan.rejected_examples)
        files.extend(scan.files)
        per_source.append({"root": src.root, "repo": src.repo, "commit": commit, "seen": scan.seen,
                           "accepted": len(scan.files),
                           "rejected": dict(scan.rejected)})
    table, duplicates = build_corpus_table(files, split_unit=cfg.split_unit, val_fraction=cfg.val_fraction,
                                           salt=cfg.split_salt)
    if duplicates:
        rejected["exact_duplicate"] += duplicates
    shards = {}
    split_stats = {}
    for split in ("train", "val"):
        part = table.filter(table["split"] == split)
        if progress:
            progress(f"writing {split} shards ({part.height} files)")
        shards[split] = write_shards(part, out_dir / split, split, cfg.shard_max_rows)
        split_stats[split] = {"files": part.height, "bytes": int(part["bytes"].sum()),
                              "units": len({split_key(r, p, cfg.split_unit)
                                            for r, p in zip(part["repo"], part["path"], strict=True)})}
    return {
        "files_seen": seen,
        "files_kept": table.height,
        "bytes_kept": int(table["bytes"].sum()),
        "rejected_by_reason": dict(sorted(rejected.items())),
        "rejected_examples": examples[:200],
        "splits": split_stats,
        "shards": shards,
        "sources": per_source,
    }
