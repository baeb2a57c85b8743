"""Reading a folder of source files (a local directory) into rows, with every rejected file counted by reason.

Rejections never stop the run: binary files, invalid UTF-8, empty files, files too large, unreadable files,
symlink loops, broken links, symlinked folders and file links that lead out of the root (or into its VCS
folder) are each counted under their reason and listed (path, reason) so nothing is silently lost. A missing
or non-directory source root is an immediate error.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import hashlib
import io
import os
import re
import stat
import subprocess
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

BINARY_SNIFF_BYTES = 8192
VCS_DIRS = frozenset({".git", ".hg", ".svn"})  # never corpus content, whatever the include patterns say
FOLDER_REASONS = ("unreadable", "unreadable_dir", "symlinked_dir_not_followed", "symlink_outside_root",
                  "symlink_into_vcs_dir", "symlink_loop", "broken_symlink", "not_regular_file", "too_large", "empty",
                  "binary", "invalid_utf8")
# What a walk passes over, by design rather than failure: a folder in skip_dirs (or a VCS folder or a virtualenv),
# a folder or file an exclude pattern names, a file the include patterns (or the language table) do not take.
WALK_REASONS = ("skipped_dir", "excluded_dir", "excluded", "not_included")


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


def matches_any(relpath: str, patterns: Sequence[str]) -> bool:
    return any(glob_regex(p).match(relpath) for p in patterns)


def dir_excluded(reldir: str, patterns: Sequence[str]) -> bool:
    """A folder is pruned when everything under it is excluded (``dir/**`` style patterns)."""
    probe = f"{reldir}/\0probe"
    return any(p.endswith("/**") and glob_regex(p).match(probe) for p in patterns)


def file_extension(relpath: str) -> str:
    """The lower-cased extension the language table is keyed by: the file name's last ``.xxx``, '' if none.
    The same rule as ``filters.language_expr``, which names the language of each row the ingest reads."""
    name = relpath.rsplit("/", 1)[-1]
    dot = name.rfind(".")
    return name[dot:].lower() if 0 <= dot < len(name) - 1 else ""


@dataclass(frozen=True)
class FolderRules:
    """What a folder walk takes: the files ``include`` matches (when empty: those whose extension is one of
    ``extensions``), less those ``exclude`` matches, never entering the folders ``skip_dirs`` names."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    skip_dirs: tuple[str, ...] = ()
    extensions: Collection[str] = frozenset()

    def includes(self, relpath: str) -> bool:
        return matches_any(relpath, self.include) if self.include else file_extension(relpath) in self.extensions


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


def skipped_dir(name: str, abspath: str, skip_dirs: Sequence[str]) -> bool:
    """VCS folders always; then the configured names (globs allowed) and virtualenvs (``pyvenv.cfg``)."""
    if name in VCS_DIRS or any(fnmatch.fnmatchcase(name, pat) for pat in skip_dirs):
        return True
    return bool(skip_dirs) and os.path.isfile(os.path.join(abspath, "pyvenv.cfg"))


def iter_candidates(root: Path, rules: FolderRules, on_error: Rejections | None = None,
                    passed_over: Rejections | None = None) -> Iterator[str]:
    """Relative (POSIX) paths of the files ``rules`` take, in sorted order: the one walk of a folder source,
    shared by the ingest, its fingerprint and ``codemill plan``. ``on_error`` gets the entries that could not
    be walked; ``passed_over`` the folders and files the rules leave out, under ``WALK_REASONS``."""
    def passed(relpath: str, reason: str) -> None:
        if passed_over is not None:
            passed_over.reject(relpath, reason)

    def onerror(exc: OSError) -> None:
        if on_error is not None and exc.filename:
            rel = os.path.relpath(exc.filename, root)
            on_error.reject(Path(rel).as_posix(), "unreadable_dir")

    top = str(root)
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False, onerror=onerror):
        # os.walk joins each folder onto ``top``: the relative part is the rest of the string
        reldir = dirpath[len(top):].lstrip(os.sep).replace(os.sep, "/")
        kept = []
        for d in sorted(dirnames):
            rel = f"{reldir}/{d}" if reldir else d
            if os.path.islink(os.path.join(dirpath, d)):
                if on_error is not None:
                    on_error.reject(rel, "symlinked_dir_not_followed")
                continue
            if skipped_dir(d, os.path.join(dirpath, d), rules.skip_dirs):
                passed(rel, "skipped_dir")
            elif dir_excluded(rel, rules.exclude):
                passed(rel, "excluded_dir")
            else:
                kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = f"{reldir}/{name}" if reldir else name
            if matches_any(rel, rules.exclude):
                passed(rel, "excluded")
            elif not rules.includes(rel):
                passed(rel, "not_included")
            else:
                yield rel


def _inside(path: str, real_root: str) -> bool:
    return path == real_root or path.startswith(real_root.rstrip(os.sep) + os.sep)


def _opened_path(fd: int, path: str) -> str:
    """The real path of an open file: /proc/self/fd (Linux), F_GETPATH (macOS), else the path resolved now."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    getpath = getattr(fcntl, "F_GETPATH", None)
    if getpath is not None:
        return os.fsdecode(fcntl.fcntl(fd, getpath, bytes(4096)).rstrip(b"\0"))
    return os.path.realpath(path)


def _escape(real: str, real_root: str, follow_external: bool) -> str | None:
    """Why a file at real path ``real`` may not be read: it lies outside the root, or in a VCS folder."""
    if not _inside(real, real_root):
        return None if follow_external else "symlink_outside_root"
    parts = real[len(real_root.rstrip(os.sep)) + 1:].split(os.sep)  # inside: the root and a separator lead
    return "symlink_into_vcs_dir" if any(part in VCS_DIRS for part in parts) else None


def open_source_file(real_root: str, rel: str, follow_external: bool = False) -> tuple[io.BufferedReader, int] | str:
    """The open regular file ``rel`` under the (real) root and its size, or the reason it is refused.

    A cloned repository is untrusted input: a file symlink whose target resolves outside the root (or into
    its ``.git``) is refused, so a link to a credentials file never enters the corpus. The check runs on
    the file actually opened (its path from the open descriptor), so swapping a path for a link between the
    walk, the check and the read cannot get around it; a path that was not a link is opened with O_NOFOLLOW.
    FIFOs and devices are refused before opening, and opening is non-blocking in case one is swapped in.
    """
    path = os.path.join(real_root, rel)
    try:
        st = os.lstat(path)
        is_link = stat.S_ISLNK(st.st_mode)
        if is_link and (why := _escape(os.path.realpath(path), real_root, follow_external)):
            return why
        if is_link:
            st = os.stat(path)  # follows file symlinks
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symlink_loop"
        if exc.errno == errno.ENOENT:
            return "broken_symlink"
        return "unreadable"
    if not stat.S_ISREG(st.st_mode):
        return "not_regular_file"
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags if is_link else flags | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return "unreadable"  # also a file replaced by a link since the lstat (O_NOFOLLOW: ELOOP)
    fh = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fd)
        why = ("not_regular_file" if not stat.S_ISREG(st.st_mode)
               else _escape(_opened_path(fd, path), real_root, follow_external))
    except OSError:
        why = "unreadable"
    if why:
        fh.close()
        return why
    return fh, st.st_size


def read_source_file(real_root: str, rel: str, max_bytes: int,
                     follow_external: bool = False) -> tuple[bytes | None, str | None]:
    """Raw bytes of the regular file ``rel`` under the root, or (None, reason) when it cannot be taken."""
    got = open_source_file(real_root, rel, follow_external)
    if isinstance(got, str):
        return None, got
    fh, size = got
    with fh:
        if size > max_bytes:
            return None, "too_large"
        try:
            # sized by fstat, not max_bytes: a 1 MB buffer per file costs an mmap and page faults each time;
            # a file that grew since is read on up to max_bytes + 1, as a plain read(max_bytes + 1) would
            want = size + 1
            raw = fh.read(want)
            if len(raw) == want and want <= max_bytes:
                raw += fh.read(max_bytes + 1 - want)
        except OSError:
            return None, "unreadable"
    if len(raw) > max_bytes:
        return None, "too_large"
    return raw, None


def decode_source(raw: bytes) -> tuple[str | None, str | None]:
    """UTF-8 text, or (None, reason): empty, binary (NUL bytes), invalid_utf8."""
    if not raw or raw.isspace():  # the bytes.strip() whitespace, without copying the file
        return None, "empty"
    if raw.find(b"\0", 0, BINARY_SNIFF_BYTES) != -1:
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


def fingerprint_source(root: str | Path, rules: FolderRules, follow_external: bool = False) -> tuple[str, int]:
    """sha256 over (relative path, content hash) of every candidate file: the source's content identity.

    Touching a file does not change it; editing, adding or removing one does. Unreadable entries enter by
    their failure reason so that fixing them changes the fingerprint too; a link that is not read is not
    followed here either. Returns (digest, file count).
    """
    root_path = check_source_root(root)
    real_root = os.path.realpath(root_path)
    h = hashlib.sha256()
    n = 0
    for rel in iter_candidates(root_path, rules):
        n += 1
        got = open_source_file(real_root, rel, follow_external)
        if isinstance(got, str):
            piece = f"!{got}"
        else:
            with got[0] as fh:
                try:
                    piece = hashlib.file_digest(fh, "sha256").hexdigest()
                except OSError:
                    piece = "!unreadable"
        h.update(f"{rel}\0{piece}\n".encode())
    return h.hexdigest(), n
