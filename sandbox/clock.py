"""A sample's wall clock, less the time the machine's load took from it.

A plain wall clock makes a verdict depend on how busy the machine is: a correct program that needs 0.2 s of
CPU, starved by other work, runs past a 1 s limit and is judged "timed out". This clock counts a sample's *own*
time instead: the wall time elapsed, less the time its answering process (and the fork server that started it)
waited on a run queue for a CPU (``procstat.Usage.waited_s``), but never less than the CPU time all its processes
used. So

- a busy loop times out once it has used the budget in CPU seconds, loaded machine or not;
- a sleeping or blocked program times out when the budget has passed (sleep is its own time, not a wait);
- load a program makes for itself (processes of its own keeping the CPUs busy) earns nothing: the CPU they use
  counts as its time, so the credit ``min(waited, elapsed - cpu)`` is zero once they use a CPU's worth.

``backstop_s`` is a hard wall clock over all of it: past it the sample is ``starved`` (the load held it back more
than the backstop allows) and the caller decides (the judge pool runs it again once, alone). Usage is read only
when a deadline passes, so samples that finish in time pay nothing for the clock.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from codemill.sandbox.procstat import Usage

POLL_S = 0.05  # the least the deadline moves on by at a check: a sample gets at most this much past its budget
FRAME_GRACE_S = 1.0  # the rest of an answer whose first bytes came in just before the backstop
TIMED_OUT, STARVED = "timed_out", "starved"


@dataclass
class LoadClock:
    budget_s: float  # own time the sample may use
    backstop_s: float  # wall time it may never exceed
    start: float
    credit_s: float = 0.0  # wait the load caused, as of the last check
    next_check: float = 0.0

    @classmethod
    def started(cls, budget_s: float, backstop_s: float, start: float | None = None) -> LoadClock:
        """A clock from ``start`` (now by default): first check when the budget has passed."""
        start = time.monotonic() if start is None else start
        return cls(budget_s, max(backstop_s, budget_s), start, next_check=start + budget_s)

    def deadline(self) -> float:
        return min(self.next_check, self.hard_deadline())

    def hard_deadline(self) -> float:
        return self.start + self.backstop_s

    def frame_deadline(self) -> float:
        """Until when the rest of an answer whose first bytes are in may take: the backstop, or a little longer
        when they came in just before it."""
        return max(self.hard_deadline(), time.monotonic() + FRAME_GRACE_S)

    def own_s(self, now: float) -> float:
        return now - self.start - self.credit_s

    def check(self, usage: Usage | None, now: float | None = None) -> str | None:
        """At or after ``deadline()``: TIMED_OUT when the sample has used its budget, STARVED at the backstop,
        else None and the deadline moves on by the newly credited wait. No usage (unreadable): no credit."""
        now = time.monotonic() if now is None else now
        elapsed = now - self.start
        self.credit_s = credit(usage, elapsed) if usage is not None else 0.0
        if self.own_s(now) >= self.budget_s:
            return TIMED_OUT
        if elapsed >= self.backstop_s:
            return STARVED
        self.next_check = max(self.start + self.budget_s + self.credit_s, now + POLL_S)
        return None


def credit(usage: Usage, elapsed: float) -> float:
    """How much of ``elapsed`` the load took: the answering process's wait, at most what the sample's processes
    left of it unused (their CPU time is always the sample's own)."""
    return max(0.0, min(usage.waited_s, elapsed - usage.cpu_s))


def wait_readable(sock: socket.socket, clock: LoadClock, usage: Callable[[], Usage | None]) -> str | None:
    """Block until ``sock`` has data or is closed (None), or the clock ends the sample (TIMED_OUT / STARVED).
    An answer already there when a deadline is looked at counts: a host the load kept from looking in time
    must not turn a sample that finished into a time-out."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        if poller.poll(max(0.0, clock.deadline() - time.monotonic()) * 1000):
            return None
        if time.monotonic() < clock.deadline():
            continue
        ended = clock.check(usage())
        if ended is not None:
            return ended
