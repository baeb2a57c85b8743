"""Slots of long-lived sandbox servers, for everything that runs code in the sandbox many times: the judge pool
(a candidate and a judge server per slot) and the augmented tests' batch runner (a candidate server per slot).

A slot holds one server per role, each under a uid of its own leased for the slot's life (``uids``), so no other
slot, pool or process on the machine runs sandboxed code as it (shared process limits, shared keyrings). A server
found dead is replaced at its next use and one that failed a sample is dropped; both count as restarts
(``codemill_sandbox_server_restarts_total``). A start that fails is tried again (a loaded machine, a uid still
draining its last processes) before the sandbox counts as unavailable, which fails the work closed.

The pool fails closed too: the sandbox is probed (no network, the servers up under their own uids) and the first
slot's servers started before any work runs; a failed probe or start counts in
``codemill_sandbox_probe_failures_total``. Work spreads over the slots one thread per slot (the threads only wait
on sockets): each item borrows a free slot, runs on it, and gives it back.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Self, TypeVar

from codemill import metrics
from codemill.cpus import usable_cpus
from codemill.sandbox.limits import Limits
from codemill.sandbox.runner import Sandbox, SandboxUnavailable
from codemill.sandbox.servers import Server
from codemill.sandbox.uids import LEASES

T = TypeVar("T")
R = TypeVar("R")

START_ATTEMPTS = 3


class Slot:
    """One worker's servers, one per role, started on first use and replaced when they die."""

    def __init__(self, sandbox: Sandbox, roles: Sequence[str]) -> None:
        self.sandbox = sandbox
        self.servers: dict[str, Server | None] = dict.fromkeys(roles)
        self.uids: dict[str, int] = {}
        self.restarts = 0
        try:
            for role in roles:
                self.uids[role] = LEASES.take()
        except BaseException:  # no free uid: what was taken goes back
            self.close()
            raise

    def server(self, role: str) -> Server:
        """The role's server, started (or restarted, when it died) as needed."""
        current = self.servers[role]
        if current is None or not current.alive():
            if current is not None:
                current.stop()
                self._restarted()
            current = self._start(role)
            self.servers[role] = current
        return current

    def drop(self, role: str) -> None:
        """Stop the role's server after it failed a sample; the next use starts a fresh one."""
        current = self.servers[role]
        if current is not None:
            current.stop()
            self.servers[role] = None
            self._restarted()

    def _restarted(self) -> None:
        self.restarts += 1
        metrics.get().sandbox_server_restarts.inc()

    def _start(self, role: str) -> Server:
        for attempt in range(START_ATTEMPTS):
            try:
                return Server.start(self.sandbox, role, self.uids[role])
            except SandboxUnavailable:
                metrics.get().sandbox_probe_failures.inc()
                if attempt == START_ATTEMPTS - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def close(self) -> None:
        for role, current in self.servers.items():
            if current is not None:
                current.stop()
                self.servers[role] = None
        for uid in self.uids.values():
            LEASES.give_back(uid)
        self.uids = {}


class SlotPool:
    """``workers`` slots with a server per role in each; ``open()`` before use, ``close()`` after."""

    def __init__(self, roles: Sequence[str], limits: Limits | None = None, workers: int | None = None,
                 unsafe: bool = False) -> None:
        self.roles = tuple(roles)
        self.limits = limits or Limits()
        self.workers = workers or usable_cpus()
        self.sandbox = Sandbox(self.limits, unsafe=unsafe)
        self.isolation: dict[str, str] = {}  # what the probe found isolates the servers (``Sandbox.describe``)
        self._free: queue.Queue[Slot] = queue.Queue()
        self._all: list[Slot] = []
        self._open = 0  # slots counted in codemill_sandbox_slots

    def open(self) -> None:
        """Probe the sandbox, lease every slot's uids and start the first slot's servers; on a failure what was
        opened is closed and the error raised."""
        try:
            self.isolation = self.sandbox.probe()
        except SandboxUnavailable:
            metrics.get().sandbox_probe_failures.inc()
            raise
        try:
            for _ in range(self.workers):
                slot = Slot(self.sandbox, self.roles)
                self._all.append(slot)
                self._free.put(slot)
                self._open += 1
                metrics.get().sandbox_slots.inc()
            for role in self.roles:
                self._all[0].server(role)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for slot in self._all:
            slot.close()
        metrics.get().sandbox_slots.dec(self._open)
        self._open = 0

    @property
    def restarts(self) -> int:
        """Servers replaced since the pool opened, over all slots."""
        return sum(s.restarts for s in self._all)

    def map(self, work: Callable[[Slot, T], R], items: Sequence[T],
            on_done: Callable[[int, int], None] | None = None) -> list[R]:
        """``work(slot, item)`` for every item, results in input order; ``on_done(done, total)`` after each."""
        done = 0
        lock = threading.Lock()

        def one(item: T) -> R:
            nonlocal done
            try:
                with self.borrow() as slot:
                    return work(slot, item)
            finally:
                with lock:
                    done += 1
                    if on_done:
                        on_done(done, len(items))

        with ThreadPoolExecutor(max_workers=self.workers) as ex:
            return list(ex.map(one, items))

    @contextmanager
    def borrow(self) -> Iterator[Slot]:
        """A free slot for the block (waiting for one), counted busy in ``codemill_sandbox_slots_busy``."""
        slot = self._free.get()
        busy = metrics.get().sandbox_slots_busy
        busy.inc()
        try:
            yield slot
        finally:
            busy.dec()
            self._free.put(slot)


class OnSlots:
    """The life of a service built on a slot pool (the judge pool, the augmented tests' runner): opened on
    ``with``, closed on the way out, with the pool's isolation and restart count."""

    slots: SlotPool

    def __enter__(self) -> Self:
        self.slots.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.slots.close()

    @property
    def isolation(self) -> dict[str, str]:
        """What the probe found isolates the verdicts (``Sandbox.describe``)."""
        return self.slots.isolation

    @property
    def restarts(self) -> int:
        return self.slots.restarts
