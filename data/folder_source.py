"""Reading a folder of source files (a local directory) into rows, with every rejected file counted by reason.

Rejections never stop the run: binary files, invalid UTF-8, empty files, files too large, unreadable files,
symlink loops and broken links are each counted under their reason and listed (path, reason) so nothing is
silently lost. A missing or non-directory source root is an immediate error.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import re
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from codemill.hashing import sha256_file

BINARY_SNIFF_BYTES = 8192
VCS_DIRS = frozenset({".git", ".hg", ".svn"})  # never corpus content, whatever the include patterns say


@lru_cache(maxsize=256)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over relative POSIX paths as a regex: ``**`` spans any number of folders (as in .gitignore)."""
    i, out = 0, []
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def matches_any(relpath: str, patterns: list[str]) -> bool:
    return any(glob_regex(p).match(relpath) for p in patterns)


def dir_excluded(reldir: str, patterns: list[str]) -> bool:
    """A folder is pruned when everything under it is excluded (``dir/**`` style patterns)."""
    probe = f"{reldir}/\0probe"
    return any(p.endswith("/**") and glob_regex(p).match(probe) for p in patterns)


class SourceNotFoundError(FileNotFoundError):
    pass


@dataclass
class Rejections:
    """Entries a folder walk could not take (unreadable folders, symlinked folders), by relative path."""

    entries: list[tuple[str, str]] = field(default_factory=list)

    def reject(self, relpath: str, reason: str) -> None:
        self.entries.append((relpath, reason))


def check_source_root(root: str | Path) -> Path:
    p = Path(root)
    if not p.exists():
        raise SourceNotFoundError(f"source path does not exist: {p}")
    if not p.is_dir():
        raise SourceNotFoundError(f"source path is not a directory: {p}")
    return p


def skipped_dir(name: str, abspath: str, skip_dirs: list[str]) -> bool:
    """VCS folders always; then the configured names (globs allowed) and virtualenvs (``pyvenv.cfg``)."""
    if name in VCS_DIRS or any(fnmatch.fnmatchcase(name, pat) for pat in skip_dirs):
        return True
    return bool(skip_dirs) and os.path.isfile(os.path.join(abspath, "pyvenv.cfg"))


def iter_candidates(root: Path, include: list[str], exclude: list[str],
                    on_error: Rejections | None = None,
                    skip_dirs: list[str] | None = None) -> Iterator[tuple[str, Path]]:
    """(relative path, absolute path) of files matching include and not exclude, in sorted order."""
    skip = list(skip_dirs or [])
    def onerror(exc: OSError) -> None:
        if on_error is not None and exc.filename:
            rel = os.path.relpath(exc.filename, root)
            on_error.reject(Path(rel).as_posix(), "unreadable_dir")

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=onerror):
        reldir = Path(os.path.relpath(dirpath, root)).as_posix()
        reldir = "" if reldir == "." else reldir
        kept = []
        for d in sorted(dirnames):
            rel = f"{reldir}/{d}" if reldir else d
            if os.path.islink(os.path.join(dirpath, d)):
                if on_error is not None:
                    on_error.reject(rel, "symlinked_dir_not_followed")
                continue
            if not skipped_dir(d, os.path.join(dirpath, d), skip) and not dir_excluded(rel, exclude):
                kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = f"{reldir}/{name}" if reldir else name
            if matches_any(rel, include) and not matches_any(rel, exclude):
                yield rel, Path(dirpath) / name


def read_source_file(abspath: Path, max_bytes: int) -> tuple[bytes | None, str | None]:
    """Raw bytes of a regular file, or (None, reason) when it cannot be taken."""
    try:
        st = os.stat(abspath)  # follows file symlinks
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "symlink_loop"
        if exc.errno == errno.ENOENT:
            return None, "broken_symlink"
        return None, "unreadable"
    if not stat.S_ISREG(st.st_mode):
        return None, "not_regular_file"
    if st.st_size > max_bytes:
        return None, "too_large"
    try:
        with open(abspath, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError:
        return None, "unreadable"
    if len(raw) > max_bytes:
        return None, "too_large"
    return raw, None


def decode_source(raw: bytes) -> tuple[str | None, str | None]:
    """UTF-8 text, or (None, reason): empty, binary (NUL bytes), invalid_utf8."""
    if not raw.strip():
        return None, "empty"
    if b"\0" in raw[:BINARY_SNIFF_BYTES]:
        return None, "binary"
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "invalid_utf8"


def git_commit(root: str | Path) -> str | None:
    """HEAD of the git repository whose top level is ``root``, else None.

    Only a repository root counts: a folder that merely sits inside some work tree (the stdlib inside a
    pyenv checkout, say) is not that repository's content, so it gets no commit.
    """
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or os.path.realpath(lines[0]) != os.path.realpath(root):
        return None
    return lines[1] if len(lines[1]) in (40, 64) else None


def fingerprint_source(root: str | Path, include: list[str], exclude: list[str],
                       skip_dirs: list[str] | None = None) -> tuple[str, int]:
    """sha256 over (relative path, content hash) of every candidate file: the source's content identity.

    Touching a file does not change it; editing, adding or removing one does. Unreadable entries enter by
    their failure reason so that fixing them changes the fingerprint too. Returns (digest, file count).
    """
    root_path = check_source_root(root)
    h = hashlib.sha256()
    n = 0
    for rel, abspath in iter_candidates(root_path, include, exclude, skip_dirs=skip_dirs):
        n += 1
        try:
            piece = sha256_file(abspath) if stat.S_ISREG(os.stat(abspath).st_mode) else "!not_regular_file"
        except OSError as exc:
            piece = f"!{exc.errno}"
        h.update(f"{rel}\0{piece}\n".encode())
    return h.hexdigest(), n
