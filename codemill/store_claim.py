"""Build claims: while one run builds an artifact, another run that needs the same artifact waits for it and
reuses it, instead of building it a second time (and racing the first for its checkpoint folder).

A claim is an exclusive lock on one key of the store, held for a whole stage (produce, commit and the MLflow
record), with an owner record (run, pid, host, since) that lets a waiter say whom it waits for.

Local store: an ``flock`` on the claim file. The kernel drops it when the holder dies, however it dies, so a
claim never outlives its run. The owner record is written into the locked file and cleared on release: a record
found by the next holder names a run that died holding the claim.

S3 store (several machines, no shared kernel): a lease object made with a conditional create
(``If-None-Match: *``), so exactly one writer gets it. The holder rewrites it every ``heartbeat_s`` with
``If-Match`` on its last ETag. A waiter that sees one ETag unchanged for ``stale_after_s`` on its own monotonic
clock (no two machines' clocks are compared) takes the lease over with ``If-Match`` on that ETag, so of several
waiters exactly one wins. A holder that was alive but lost its lease finds out at its next heartbeat and builds
on; nothing breaks, because a remote commit is write-once (the first manifest wins).

Other remote stores get no claim: overlapping runs may both build there (their commits stay write-once).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)

WAIT_ENV = "CODEMILL_STORE_WAIT_S"
DEFAULT_WAIT_S = 12 * 3600.0  # longer than any stage's own timeout: a live holder is waited for, a wedged one not
HEARTBEAT_S = 20.0
STALE_AFTER_S = 120.0


def default_wait_s() -> float:
    """How long a run waits for another run's build of the same artifact: ``$CODEMILL_STORE_WAIT_S`` or 12 h."""
    return float(os.environ.get(WAIT_ENV) or DEFAULT_WAIT_S)


class ClaimOwner(BaseModel):
    """Who holds a claim: what a waiting run reports."""

    run: str
    pid: int
    host: str
    since: float
    beat: int = 0  # bumped by each heartbeat of a remote lease, so that its ETag changes

    @classmethod
    def here(cls, run: str) -> ClaimOwner:
        return cls(run=run, pid=os.getpid(), host=socket.gethostname(), since=time.time())

    def same_holder(self, other: ClaimOwner | None) -> bool:
        return other is not None and (self.run, self.pid, self.host, self.since) == \
            (other.run, other.pid, other.host, other.since)

    def describe(self) -> str:
        since = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"run {self.run!r} (pid {self.pid} on {self.host}, since {since})"


class ClaimWaitTimeout(RuntimeError):
    """Waited the bound for a holder that is still alive and still building."""


@dataclass
class Claim:
    """What taking a claim went through: whom it waited for and how long, and the holder it replaced when that
    one died holding it (None when the claim was released normally or never held)."""

    label: str
    waited_for: ClaimOwner | None = None
    waited_s: float = 0.0
    took_over: ClaimOwner | None = None


OnWait = Callable[[ClaimOwner], None]


def _parse(data: bytes) -> ClaimOwner | None:
    try:
        return ClaimOwner.model_validate_json(data) if data.strip() else None
    except ValidationError:  # a record being written while it is read
        return None


def _timeout(label: str, wait_s: float, owner: ClaimOwner | None) -> ClaimWaitTimeout:
    holder = owner.describe() if owner else "another run"
    return ClaimWaitTimeout(f"gave up after {wait_s:.0f} s waiting for {label}, which {holder} still holds; "
                            f"stop that run, or wait longer with {WAIT_ENV}")


class _Waiting:
    """The waiting side of a claim: reports each new holder once and enforces the bound."""

    def __init__(self, label: str, wait_s: float, on_wait: OnWait) -> None:
        self.label, self.wait_s, self.on_wait = label, wait_s, on_wait
        self.start = time.monotonic()
        self.owner: ClaimOwner | None = None

    def saw(self, owner: ClaimOwner | None) -> None:
        if owner is not None and not owner.same_holder(self.owner):
            self.owner = owner
            self.on_wait(owner)
        if time.monotonic() - self.start > self.wait_s:
            raise _timeout(self.label, self.wait_s, owner or self.owner)

    def claim(self, took_over: ClaimOwner | None = None) -> Claim:
        waited = self.owner is not None
        return Claim(self.label, self.owner, time.monotonic() - self.start if waited else 0.0, took_over)


@contextmanager
def local_claim(path: Path, label: str, run: str, wait_s: float, on_wait: OnWait, poll_s: float = 0.25
                ) -> Iterator[Claim]:
    """Hold the claim at ``path`` (an ``flock``) for the block, waiting at most ``wait_s`` for its holder.
    ``label`` names what is claimed in messages; ``run`` names this run in the owner record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        waiting = _Waiting(label, wait_s, on_wait)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waiting.saw(_parse(os.pread(fd, 4096, 0)))
                time.sleep(poll_s)
        left = _parse(os.pread(fd, 4096, 0))  # a record not cleared: its holder died holding the claim
        os.ftruncate(fd, 0)
        os.pwrite(fd, ClaimOwner.here(run).model_dump_json().encode(), 0)
        try:
            yield waiting.claim(took_over=left)
        finally:
            os.ftruncate(fd, 0)  # released normally: the next holder finds no record
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def is_s3(fs: Any) -> bool:
    """Whether ``fs`` is s3fs, whose writes take S3's conditions (``If-None-Match``, ``If-Match``)."""
    protocol = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    return "s3" in protocol


def _precondition_failed(exc: BaseException) -> bool:
    cause = exc.__cause__
    code = getattr(cause, "response", {}).get("Error", {}).get("Code") if cause is not None else None
    return code in ("PreconditionFailed", "412")


class S3Lease:
    """One S3 lease object: conditional create, heartbeat, takeover and release (s3fs calls)."""

    def __init__(self, fs: Any, path: str, run: str) -> None:
        self.fs, self.path = fs, path
        self.bucket, self.key, _ = fs.split_path(path)
        self.owner = ClaimOwner.here(run)
        self.etag: str | None = None
        self.lost = False

    def _put(self, **condition: str) -> None:
        out = self.fs.pipe_file(self.path, self.owner.model_dump_json().encode(), **condition)
        self.etag = out["ETag"]

    def create(self) -> bool:
        try:
            self._put(mode="create")
            return True
        except FileExistsError:
            return False

    def take_over(self, stale_etag: str) -> bool:
        """Replace the lease whose ETag stayed ``stale_etag``; False when someone else changed it first."""
        try:
            self._put(IfMatch=stale_etag)
            return True
        except FileNotFoundError:  # released meanwhile: the next create will tell
            return False
        except OSError as e:
            if _precondition_failed(e):
                return False
            raise

    def read(self) -> tuple[str, ClaimOwner | None] | None:
        """The lease's ETag and owner record, or None when there is none."""
        self.fs.invalidate_cache(self.path)
        try:
            etag = self.fs.info(self.path)["ETag"]
            return etag, _parse(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None

    def beat(self) -> bool:
        """Renew the lease; False (and ``lost``) when another run took it over."""
        self.owner.beat += 1
        try:
            self._put(IfMatch=self.etag or "")
            return True
        except (FileNotFoundError, OSError) as e:
            if not isinstance(e, FileNotFoundError) and not _precondition_failed(e):
                log.warning("claim %s: heartbeat failed (%s); retrying", self.path, e)
                return True
            self.lost = True
            return False

    def release(self) -> None:
        if self.lost or self.etag is None:
            return
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=self.etag)
        except (FileNotFoundError, OSError) as e:  # taken over meanwhile: the new holder's lease stays
            if not isinstance(e, FileNotFoundError) and not _precondition_failed(e):
                raise
        self.fs.invalidate_cache(self.path)


@contextmanager
def _heartbeat(lease: S3Lease, every_s: float) -> Iterator[None]:
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every_s):
            if not lease.beat():
                log.warning("claim %s was taken over by another run (this run was presumed dead); building on, "
                            "the first commit wins", lease.path)
                return

    beater = threading.Thread(target=run, name="codemill-claim-heartbeat", daemon=True)
    beater.start()
    try:
        yield
    finally:
        stop.set()
        beater.join()


@contextmanager
def s3_claim(fs: Any, path: str, label: str, run: str, wait_s: float, on_wait: OnWait, *,
             heartbeat_s: float = HEARTBEAT_S, stale_after_s: float = STALE_AFTER_S, poll_s: float = 2.0
             ) -> Iterator[Claim]:
    """Hold the S3 lease at ``path`` for the block, waiting at most ``wait_s`` for a live holder and
    ``stale_after_s`` past a dead holder's last heartbeat."""
    lease = S3Lease(fs, path, run)
    waiting = _Waiting(label, wait_s, on_wait)
    seen: tuple[str, float] | None = None  # (ETag, when this waiter first saw it, on its own clock)
    took_over = None
    while not lease.create():
        current = lease.read()
        if current is None:
            continue  # released between the create and the read: try again at once
        etag, owner = current
        waiting.saw(owner)
        if seen is None or seen[0] != etag:
            seen = (etag, time.monotonic())
        elif time.monotonic() - seen[1] > stale_after_s and lease.take_over(etag):
            took_over = owner
            break
        time.sleep(poll_s)
    try:
        with _heartbeat(lease, heartbeat_s):
            yield waiting.claim(took_over=took_over)
    finally:
        lease.release()

