"""An episode's working tree: a copy-on-write layer over a repository snapshot.

Inside the sandbox the tree is an overlayfs mount (``--overlay-src <snapshot> --overlay <upper> <work> /repo``):
reads fall through to the read-only snapshot, writes land in the episode's own ``upper`` folder, a deleted file
becomes a whiteout (a 0/0 character device). Creating a workspace makes two empty folders, and it holds only the
files the episode changed. The host side reads the same merged view from the two layers (the tools that need
no process: read, list, search, edit) and takes the episode's changes from ``upper`` alone.
"""

from __future__ import annotations

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
    def locate(self, rel: str) -> Path | None:
        """Where the merged tree's ``rel`` lives on the host (upper layer first), or None if it does not exist."""
        rel = clean_relative(rel)
        if not rel:
            return self.upper
        parts = rel.split("/")
        lower_visible = True
        for i in range(1, len(parts) + 1):
            up = self.upper.joinpath(*parts[:i])
            try:
                st = os.lstat(up)
            except FileNotFoundError:
                st = None
            if st is not None:
                if _is_whiteout(st):
                    return None
                if stat.S_ISDIR(st.st_mode) and _xattr(up, OPAQUE) == b"y":
                    lower_visible = False
                if i == len(parts):
                    return up
                if not stat.S_ISDIR(st.st_mode):
                    return None
        low = self.lower.joinpath(*parts)
        return low if lower_visible and os.path.lexists(low) else None

    def read_bytes(self, rel: str) -> bytes:
        found = self.locate(rel)
        if found is None:
            raise WorkspaceError(f"no such file: {clean_relative(rel) or '.'}")
        if found.is_dir():
            raise WorkspaceError(f"{clean_relative(rel)} is a folder")
        return found.read_bytes()

    def exists(self, rel: str) -> bool:
        return self.locate(rel) is not None

    def list_dir(self, rel: str = "") -> list[tuple[str, bool]]:
        """``(name, is_dir)`` of a folder's merged entries, sorted."""
        rel = clean_relative(rel)
        found = self.locate(rel)
        if found is None or not found.is_dir():
            raise WorkspaceError(f"no such folder: {rel or '.'}")
        names: dict[str, bool] = {}
        up = self.upper.joinpath(*rel.split("/")) if rel else self.upper
        low = self.lower.joinpath(*rel.split("/")) if rel else self.lower
        opaque = up.is_dir() and _xattr(up, OPAQUE) == b"y"
        if low.is_dir() and not opaque and self._lower_visible(rel):
            for entry in os.scandir(low):
                names[entry.name] = entry.is_dir(follow_symlinks=False)
        if up.is_dir():
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
            if up.is_dir() and _xattr(up, OPAQUE) == b"y":
                return False
        return True

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a file in the merged tree (into the upper layer), creating its folders."""
        rel = clean_relative(rel)
        if not rel:
            raise WorkspaceError("a file path is needed")
        parts = rel.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            found = self.locate(parent)
            if found is not None and not found.is_dir():
                raise WorkspaceError(f"{parent} is a file, not a folder")
            up = self.upper.joinpath(*parts[:i])
            if os.path.lexists(up) and _is_whiteout(os.lstat(up)):
                up.unlink()  # a folder deleted, now made anew: it must not show the snapshot's old files
                up.mkdir()
                os.setxattr(up, OPAQUE[0] if os.geteuid() == 0 else OPAQUE[1], b"y")
            up.mkdir(exist_ok=True)
            up.chmod(0o777)
        target = self.upper.joinpath(*parts)
        if target.is_dir():
            raise WorkspaceError(f"{rel} is a folder")
        if os.path.lexists(target):
            target.unlink()
        target.write_bytes(data)
        target.chmod(0o666)

    # --- what the episode changed ---------------------------------------------------------------------
    def changes(self) -> dict[str, bytes | None]:
        """Every file the episode created, changed or deleted, by path: new bytes, or None for a deletion.
        Symbolic links are recorded as their target text prefixed with ``symlink:`` (the grader refuses them)."""
        out: dict[str, bytes | None] = {}
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
        return low.is_file() and not low.is_symlink() and low.read_bytes() == data

    def disk_bytes(self) -> int:
        """What the episode's layer holds on disk (the changed files and the overlay's own entries)."""
        return sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file() and not f.is_symlink())


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir() or p.is_symlink())


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
