"""Sandbox uids leased per process, so two pools (or two runs) on one machine never share a uid.

A uid carries state past a sample: RLIMIT_NPROC counts every process of the uid machine-wide (one pool's fork
bomb would starve another's servers), and the kernel's per-uid keyrings are shared by every sandbox running as
that uid. So a uid is held by exactly one sandbox server (or one single-program sandbox) at a time: holding it
is an exclusive ``flock`` on ``<lease dir>/<uid>.lock``, which the kernel releases when the holder closes it or
dies, so a crashed process never strands a uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator

UID_FIRST = 61000
UID_COUNT = 1000
LEASE_DIR = os.path.join(tempfile.gettempdir(), "codemill-sandbox-uids")


class NoFreeUid(RuntimeError):
    pass


class UidLeases:
    """The uids this process holds; ``take()`` finds a free one, ``give_back(uid)`` releases it."""

    def __init__(self, first: int = UID_FIRST, count: int = UID_COUNT, lease_dir: str = LEASE_DIR) -> None:
        self.first, self.count, self.lease_dir = first, count, lease_dir
        self._held: dict[int, int] = {}  # uid -> the locked file's descriptor
        self._lock = threading.Lock()

    def take(self) -> int:
        os.makedirs(self.lease_dir, mode=0o700, exist_ok=True)
        with self._lock:
            for uid in range(self.first, self.first + self.count):
                if uid in self._held:
                    continue
                fd = os.open(os.path.join(self.lease_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                             0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._held[uid] = fd
                return uid
        raise NoFreeUid(f"all {self.count} sandbox uids from {self.first} are held by other sandboxes")

    def give_back(self, uid: int) -> None:
        with self._lock:
            fd = self._held.pop(uid, None)
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock

    @contextlib.contextmanager
    def lease(self) -> Iterator[int]:
        uid = self.take()
        try:
            yield uid
        finally:
            self.give_back(uid)


LEASES = UidLeases()
