"""An episode's working tree: a copy-on-write layer over a repository snapshot.

Inside the sandbox the tree is an overlayfs mount (``--overlay-src <snapshot> --overlay <upper> <work> /repo``):
reads fall through to the read-only snapshot, writes land in the episode's own ``upper`` folder, a deleted file
becomes a whiteout (a 0/0 character device). Creating a workspace makes two empty folders, and it holds only the
files the episode changed. The host side reads the same merged view from the two layers (the tools that need
no process: read, list, search, edit) and takes the episode's changes from ``upper`` alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from codemill.errors import UserFacingError

MOUNT_POINT = "/repo"
OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")
REDIRECT = ("trusted.overlay.redirect", "user.overlay.redirect")


class WorkspaceError(UserFacingError, ValueError):
    """A path the tools refuse (outside the tree, a folder where a file is needed, ...): shown to the agent."""


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "link"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return "file" if stat.S_ISREG(st.st_mode) else "other"


def _read_regular(path: Path, limit: int, shown: str) -> bytes:
    """A regular file's bytes, opened without following a link or blocking on a FIFO, at most ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise WorkspaceError(f"{shown}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise WorkspaceError(f"{shown} is not a regular file")
        if st.st_size > limit:
            raise WorkspaceError(f"{shown} is {st.st_size} bytes, over the {limit}-byte limit")
        return fh.read(limit + 1)


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _xattr(path: Path, names: tuple[str, ...]) -> bytes | None:
    for name in names:
        try:
            return os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            continue
    return None


def clean_relative(path: str) -> str:
    """``path`` as a clean path inside the tree (``/repo/a/b``, ``./a//b`` -> ``a/b``); one that leaves it
    is refused."""
    p = path.strip()
    if p.startswith(MOUNT_POINT + "/") or p == MOUNT_POINT:
        p = p[len(MOUNT_POINT):]
    parts: list[str] = []
    for part in p.strip("/").split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise WorkspaceError(f"{path!r} is outside the repository")
            parts.pop()
            continue
        parts.append(part)
    return "/".join(parts)


class Workspace:
    """The layers of one working tree: ``lower`` (the snapshot, never written) and ``upper``/``work`` (the
    overlay's write layer and its scratch folder, both in ``root``)."""

    def __init__(self, lower: Path, root: Path) -> None:
        self.lower, self.root = Path(lower), Path(root)
        self.upper, self.work = self.root / "upper", self.root / "work"

    @classmethod
    def create(cls, lower: Path, parent: Path | None = None) -> Workspace:
        """A fresh, empty layer over ``lower`` (milliseconds: two folders)."""
        root = Path(tempfile.mkdtemp(prefix="ws-", dir=parent))
        ws = cls(lower, root)
        for d in (ws.upper, ws.work):
            d.mkdir()
            d.chmod(0o777)  # the sandbox's uid writes here when codemill runs as root
        return ws

    def mounts(self) -> tuple[str, ...]:
        """The bwrap arguments that mount this tree at ``/repo``."""
        return ("--overlay-src", str(self.lower), "--overlay", str(self.upper), str(self.work), MOUNT_POINT)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # --- the merged view ------------------------------------------------------------------------------
    # The host reads and writes the layers for the agent, so it never follows a symbolic link (the agent makes
    # them at will in the sandbox, and one to / would hand it the host's files) and reads regular files only (a
    # FIFO would block the reader forever).
    def _entry(self, rel: str) -> tuple[Path | None, str]:
        """Where the merged tree's ``rel`` lives (upper layer first) and what it is: ``file``, ``dir``, ``link``,
        ``other`` (a device, FIFO or socket) or ``missing`` (then the path is None)."""
        rel = clean_relative(rel)
        if not rel:
            return self.upper, "dir"
        parts = rel.split("/")
        lower_visible = True
        for i in range(1, len(parts) + 1):
            last = i == len(parts)
            found: Path | None = None
            up = self.upper.joinpath(*parts[:i])
            st = _lstat(up)
            if st is not None:
                if _is_whiteout(st):
                    return None, "missing"
                if stat.S_ISDIR(st.st_mode) and _xattr(up, OPAQUE) == b"y":
                    lower_visible = False
                found = up
            elif lower_visible:
                low = self.lower.joinpath(*parts[:i])
                st = _lstat(low)
                found = low if st is not None else None
            if found is None or st is None:
                return None, "missing"
            kind = _kind(st)
            if last or kind != "dir":
                return (found, kind) if last or kind == "link" else (None, "missing")
        return None, "missing"  # not reached: the loop returns at the last part

    def locate(self, rel: str) -> Path | None:
        """Where the merged tree's ``rel`` lives on the host, or None if it does not exist."""
        return self._entry(rel)[0]

    def _require(self, rel: str, want: str) -> Path:
        where, kind = self._entry(rel)
        shown = clean_relative(rel) or "."
        if kind == "missing" or where is None:
            raise WorkspaceError(f"no such {'folder' if want == 'dir' else 'file'}: {shown}")
        if kind == "link":
            raise WorkspaceError(f"{shown} is a symbolic link (the tools do not follow links)")
        if kind != want:
            raise WorkspaceError(f"{shown} is {'a folder' if kind == 'dir' else 'not a regular file'}"
                                 if want == "file" else f"{shown} is not a folder")
        return where

    def read_bytes(self, rel: str, limit: int = 64 << 20) -> bytes:
        return _read_regular(self._require(rel, "file"), limit, clean_relative(rel))

    def exists(self, rel: str) -> bool:
        return self._entry(rel)[1] != "missing"

    def kind(self, rel: str) -> str:
        """``file``, ``dir``, ``link`` (the path or a folder on its way is a link), ``other`` or ``missing``."""
        return self._entry(rel)[1]

    def list_dir(self, rel: str = "") -> list[tuple[str, bool]]:
        """``(name, is_dir)`` of a folder's merged entries, sorted (a link is listed as what it is, not as what it
        points to)."""
        rel = clean_relative(rel)
        self._require(rel, "dir")
        names: dict[str, bool] = {}
        up = self.upper.joinpath(*rel.split("/")) if rel else self.upper
        low = self.lower.joinpath(*rel.split("/")) if rel else self.lower
        up_st = _lstat(up)
        up_dir = up_st is not None and stat.S_ISDIR(up_st.st_mode)
        opaque = up_dir and _xattr(up, OPAQUE) == b"y"
        low_st = _lstat(low)
        if low_st is not None and stat.S_ISDIR(low_st.st_mode) and not opaque and self._lower_visible(rel):
            for entry in os.scandir(low):
                names[entry.name] = entry.is_dir(follow_symlinks=False)
        if up_dir:
            for entry in os.scandir(up):
                st = entry.stat(follow_symlinks=False)
                if _is_whiteout(st):
                    names.pop(entry.name, None)
                else:
                    names[entry.name] = stat.S_ISDIR(st.st_mode)
        return sorted(names.items())

    def _lower_visible(self, rel: str) -> bool:
        parts = rel.split("/") if rel else []
        for i in range(1, len(parts) + 1):
            up = self.upper.joinpath(*parts[:i])
            st = _lstat(up)
            if st is not None and stat.S_ISDIR(st.st_mode) and _xattr(up, OPAQUE) == b"y":
                return False
        return True

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a regular file in the merged tree (into the upper layer), creating its folders; a link or a
        special file on the way is refused. Written to a temporary name and renamed: a reader never sees half."""
        rel = clean_relative(rel)
        if not rel:
            raise WorkspaceError("a file path is needed")
        parts = rel.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            where, kind = self._entry(parent)
            if kind not in ("dir", "missing"):
                raise WorkspaceError(f"{parent} is {'a symbolic link' if kind == 'link' else 'not a folder'}")
            up = self.upper.joinpath(*parts[:i])
            st = _lstat(up)
            if st is not None and _is_whiteout(st):
                up.unlink()  # a folder deleted, now made anew: it must not show the snapshot's old files
                up.mkdir()
                os.setxattr(up, OPAQUE[1], b"y")  # bwrap mounts the overlay with userxattr, even as root
                up.chmod(0o777)
            elif st is None:
                up.mkdir()
                up.chmod(0o777)
            elif not stat.S_ISDIR(st.st_mode):
                raise WorkspaceError(f"{parent} is not a folder")
        where, kind = self._entry(rel)
        if kind not in ("file", "missing"):
            raise WorkspaceError(f"{rel} is {'a folder' if kind == 'dir' else 'not a regular file'}")
        target = self.upper.joinpath(*parts)
        fd, tmp = tempfile.mkstemp(prefix=".codemill-", dir=target.parent)
        try:
            os.fchmod(fd, 0o666)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # --- what the episode changed ---------------------------------------------------------------------
    def changes(self, max_bytes: int = 64 << 20) -> dict[str, bytes | None]:
        """Every file the episode created, changed or deleted, by path: new bytes, or None for a deletion.
        Symbolic links are recorded as their target text prefixed with ``symlink:`` (the grader refuses them);
        FIFOs, sockets and devices are left out. More than ``max_bytes`` of changed files is refused."""
        out: dict[str, bytes | None] = {}
        total = sum(e.stat(follow_symlinks=False).st_size for e in _scan_tree(self.upper)
                    if e.is_file(follow_symlinks=False))
        if total > max_bytes:
            raise WorkspaceError(f"the changes hold {total} bytes, over the {max_bytes}-byte limit")
        self._walk(self.upper, "", out)
        return {k: v for k, v in sorted(out.items()) if not self._unchanged(k, v)}

    def _walk(self, folder: Path, prefix: str, out: dict[str, bytes | None]) -> None:
        if _xattr(folder, REDIRECT) is not None:
            raise WorkspaceError(f"{prefix or '.'} was moved with overlayfs redirects, which the grader does not "
                                 "read; the kernel's overlay redirect_dir must be off")
        if prefix and _xattr(folder, OPAQUE) == b"y":
            low = self.lower / prefix
            if low.is_dir():
                for path in _files_under(low):
                    out[f"{prefix}/{path}"] = None
        for entry in os.scandir(folder):
            rel = f"{prefix}/{entry.name}" if prefix else entry.name
            st = entry.stat(follow_symlinks=False)
            if _is_whiteout(st):
                low = self.lower / rel
                if low.is_dir() and not low.is_symlink():
                    for path in _files_under(low):
                        out[f"{rel}/{path}"] = None
                else:
                    out[rel] = None
            elif stat.S_ISDIR(st.st_mode):
                low = self.lower / rel
                if os.path.lexists(low) and not low.is_dir():
                    out[rel] = None  # a file became a folder
                self._walk(Path(entry.path), rel, out)
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = b"symlink:" + os.readlink(entry.path).encode()
            elif stat.S_ISREG(st.st_mode):
                low = self.lower / rel
                if low.is_dir() and not low.is_symlink():
                    for path in _files_under(low):
                        out[f"{rel}/{path}"] = None
                out[rel] = Path(entry.path).read_bytes()

    def _unchanged(self, rel: str, data: bytes | None) -> bool:
        low = self.lower / rel
        if data is None:
            return not os.path.lexists(low)
        st = _lstat(low)
        return st is not None and stat.S_ISREG(st.st_mode) and st.st_size == len(data) and low.read_bytes() == data

    def disk_bytes(self) -> int:
        """What the episode's layer holds on disk (the changed files and the overlay's own entries)."""
        return sum(e.stat(follow_symlinks=False).st_size for e in _scan_tree(self.root)
                   if e.is_file(follow_symlinks=False))


def _scan_tree(folder: Path) -> list[os.DirEntry]:
    """Every entry under ``folder``, links not followed."""
    out, stack = [], [str(folder)]
    while stack:
        for entry in os.scandir(stack.pop()):
            out.append(entry)
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return out


def _files_under(folder: Path) -> list[str]:
    return sorted(os.path.relpath(e.path, folder) for e in _scan_tree(folder) if not e.is_dir(follow_symlinks=False))


def apply_changes(ws: Workspace, changes: dict[str, bytes | None]) -> None:
    """Write ``changes`` into a fresh workspace's upper layer (deletions as whiteouts)."""
    for rel, data in changes.items():
        if data is None:
            if ws.exists(rel):
                _whiteout(ws, rel)
        else:
            ws.write_bytes(rel, data)


def _whiteout(ws: Workspace, rel: str) -> None:
    rel = clean_relative(rel)
    parts = rel.split("/")
    parent = ws.upper.joinpath(*parts[:-1])
    parent.mkdir(parents=True, exist_ok=True)
    target = parent / parts[-1]
    if os.path.lexists(target):
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
    if ws.lower.joinpath(*parts).exists() or ws.lower.joinpath(*parts).is_symlink():
        os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))
