"""``folder``: the files of a local folder (a git repository root records its commit); an empty path is this
Python's stdlib. The walk itself (rules, symlinks, rejections) is ``codemill.data.folder_source``.

Files go in sorted path order, cut where a path's hash hits 0 mod ``chunk_files``; the cut points depend only on
paths, so adding or editing one file changes only its chunk (incremental re-ingest).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import polars as pl
from pydantic import Field, model_validator

from codemill.data.folder_source import (
    FolderRules,
    Rejections,
    check_source_root,
    decode_source,
    fingerprint_source,
    git_commit,
    iter_candidates,
    read_source_file,
)
from codemill.data.sources.base import (
    HF_SETTINGS_AT_DEFAULTS,
    RAW_SCHEMA,
    TABLE_COLUMNS_AT_DEFAULTS,
    ChunkSpec,
    CorpusSource,
    stdlib_root,
)

# Files a folder source skips unless its `exclude` says otherwise: lock files, which are generated. Minified
# code and generated files are not excluded by name: the filters reject them and record why.
DEFAULT_EXCLUDES = ["**/*.lock", "**/package-lock.json", "**/npm-shrinkwrap.json", "**/pnpm-lock.yaml",
                    "**/go.sum"]


# The stdlib source (a folder source with an empty path) takes its Python modules, without its test suites.
STDLIB_INCLUDE = ["**/*.py"]


STDLIB_EXCLUDES = ["site-packages/**", "test/**", "**/__pycache__/**", "idlelib/idle_test/**"]


# Folders never ingested from a folder source, matched against any path component (documented in README):
# version control, vendored dependencies, build output, caches. A folder holding `pyvenv.cfg` (a virtualenv)
# is skipped too.
DEFAULT_SKIP_DIRS = [".git", ".hg", ".svn", "node_modules", "bower_components", "vendor", "third_party",
                     "build", "dist", "target", ".venv", "__pycache__", ".tox", ".nox", ".mypy_cache",
                     ".pytest_cache", ".eggs", "*.egg-info"]


# The ingest's language table by default (``ingest.languages``): a folder source without include patterns takes
# the files with these extensions, and every row's language is read from its path through it.
DEFAULT_LANGUAGES = {
    ".py": "python", ".pyi": "python", ".pyx": "cython", ".c": "c", ".h": "c", ".cc": "c++", ".cpp": "c++",
    ".cxx": "c++", ".hpp": "c++", ".hh": "c++", ".rs": "rust", ".go": "go", ".js": "javascript",
    ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript", ".ts": "typescript", ".tsx": "typescript",
    ".java": "java", ".kt": "kotlin", ".scala": "scala", ".rb": "ruby", ".php": "php", ".cs": "c#",
    ".swift": "swift", ".m": "objective-c", ".lua": "lua", ".pl": "perl", ".r": "r", ".jl": "julia",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell", ".sql": "sql", ".html": "html", ".css": "css",
    ".md": "markdown", ".rst": "restructuredtext", ".json": "json", ".yaml": "yaml", ".yml": "yaml",
    ".toml": "toml", ".xml": "xml", ".f90": "fortran", ".hs": "haskell", ".ml": "ocaml", ".ex": "elixir",
    ".erl": "erlang", ".dart": "dart", ".zig": "zig",
}


MAX_CHUNK_FACTOR = 8  # a chunk is force-cut at this many times the mean size


class FolderSource(CorpusSource):
    """A folder of files (a git repository root records its commit); an empty path is this Python's stdlib."""

    DIGEST_COMPAT = {**TABLE_COLUMNS_AT_DEFAULTS, **HF_SETTINGS_AT_DEFAULTS}

    kind: Literal["folder"] = "folder"
    path: str | None = Field(None, description="The folder; empty = this Python's stdlib.")
    include: list[str] | None = Field(None, description="Glob patterns of files to take; empty = every file whose "
                                                        "extension is in `ingest.languages`. The stdlib source "
                                                        "(empty path) defaults to `**/*.py`.")
    exclude: list[str] = Field(DEFAULT_EXCLUDES, description="Glob patterns of files (or, ending in `/**`, "
                                                             "folders) to skip; by default lock files. The stdlib "
                                                             "source (empty path) defaults to its test folders and "
                                                             "site-packages instead.")
    skip_dirs: list[str] = Field(DEFAULT_SKIP_DIRS, description="Folder names never entered (VCS, vendored, build "
                                                                "output, caches).")
    follow_external_symlinks: bool = Field(False, description="Read file symlinks whose target lies outside the "
                                                              "folder. Off by default: a cloned repository is "
                                                              "untrusted input, and a link to a credentials file "
                                                              "would carry it into the corpus.")

    @property
    def is_stdlib(self) -> bool:
        return not self.path

    @model_validator(mode="after")
    def _stdlib_defaults(self) -> FolderSource:
        """The stdlib source's own defaults, written into the config (and so into the digest) rather than
        implied: an `include` or `exclude` the config does not set takes STDLIB_INCLUDE / STDLIB_EXCLUDES."""
        if self.is_stdlib:
            if "include" not in self.model_fields_set:
                self.include = list(STDLIB_INCLUDE)
            if "exclude" not in self.model_fields_set:
                self.exclude = list(STDLIB_EXCLUDES)
        return self

    def default_repo(self) -> str:
        if self.is_stdlib and not self.repo:
            return f"python{sys.version_info.major}.{sys.version_info.minor}-stdlib"
        return super().default_repo()

    def root(self) -> str:
        """The absolute root (empty path = the stdlib); fails naming a missing path."""
        return str(check_source_root(Path(self.path).expanduser() if self.path else stdlib_root()).resolve())

    def rules(self, languages: Mapping[str, str]) -> FolderRules:
        """The walk rules; without include patterns the walk takes the extensions of ``languages`` (the ingest's
        language table), so every file it takes gets a language."""
        return FolderRules(tuple(self.include or ()), tuple(self.exclude), tuple(self.skip_dirs), frozenset(languages))

    def chunks(self, index: int, chunk_files: int, languages: Mapping[str, str]) -> Iterator[ChunkSpec]:
        """Each chunk as soon as the walk reaches its cut point, so its work can start while the rest of the tree
        is walked; the entries the walk refused come last, in a chunk of their own."""
        root, repo = self.root(), self.default_repo()
        commit = git_commit(root)
        walk = Rejections()
        rels = iter_candidates(Path(root), self.rules(languages), on_error=walk)
        opts = {"follow_external_symlinks": self.follow_external_symlinks}
        for c in _cut_points(rels, chunk_files):
            yield ChunkSpec(index, self.kind, root, repo, tuple(c), commit, opts)
        if walk.entries:
            yield ChunkSpec(index, self.kind, root, repo, (), commit, rejected=tuple(walk.entries))

    @classmethod
    def read(cls, spec: ChunkSpec, max_bytes: int) -> pl.DataFrame:
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

    def fingerprint(self, languages: Mapping[str, str]) -> dict[str, Any]:
        """The hash of every file the walk takes, and the commit of a git repository root."""
        root, rules = self.root(), self.rules(languages)
        digest, n = fingerprint_source(root, rules, self.follow_external_symlinks)
        return {"root": root, "fingerprint": digest, "files": n, "commit": git_commit(root)}


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


SOURCES = (FolderSource,)
