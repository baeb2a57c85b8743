"""Run trusted code (a reference solution, or a mutant of one) on a batch of inputs in the sandbox.

This reuses the judge harness's candidate server (``sandbox/candidate_server.py``) as it is: a sample there is
one forked child that executes ``source`` and then answers ``{"args", "kwargs"}`` calls with plain data over a
socket, until the socket closes. Here the host holds the other end of that socket, so one sample answers a
whole batch of inputs (one program run per batch, not one per input), and every result crosses the same
plain-data codec (``wire``) as a candidate's: a result that is not plain data comes back as ``not_plain``, never
as an object. The host's deadline per call is the input's time budget; when a call runs past it (or the child
dies), the host ends the sample (the server kills the child and cleans the sandbox) and starts a fresh one for
the inputs after it. The code is trusted, but still runs isolated: it is the same path as untrusted code and
costs nothing extra.

Budgets and seconds are the call's own time, as the judge pool's wall clock counts it (``sandbox.clock``): the
time the machine's load made the child wait for a CPU is not the call's, so which inputs a reference answers in
time, and which mutants time out, does not depend on how busy the machine is. The code is trusted, so only the
answering child is read (``procstat.process_usage``: two small reads a call), not the whole sandbox.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from codemill.sandbox.clock import STARVED, LoadClock, credit, wait_readable
from codemill.sandbox.limits import Limits
from codemill.sandbox.procstat import Usage, process_usage
from codemill.sandbox.servers import Server, ServerDied
from codemill.sandbox.slot_pool import OnSlots, Slot, SlotPool
from codemill.sandbox.wire import (
    BadData,
    ChannelClosed,
    ChannelTimeout,
    decode_value,
    encode_value,
    recv_frame,
    send_frame,
)

LOAD_TIMEOUT_S = 10.0
ROLE = "candidate"  # the judge harness's candidate server, as it is


@dataclass(frozen=True)
class Call:
    """One input's result. ``status``: ok | raised | timeout | crashed | not_plain | load_error | skipped.
    ``seconds``: the call's own time (``sandbox.clock``); a timeout the load caused says ``starved`` in ``error``."""

    status: str
    value: Any = None
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Batch:
    """Run ``entry`` of ``source`` on each argument tuple; ``budgets_s`` per input. After ``max_timeouts``
    timed-out inputs the rest are ``skipped`` (a mutant that loops on everything costs a few budgets, not all)."""

    source: str
    entry: str
    inputs: Sequence[tuple[Any, ...]]
    budgets_s: Sequence[float]
    max_timeouts: int | None = None


class BatchRunner(OnSlots):
    """``with BatchRunner(limits, workers) as r: r.run_all([Batch(...), ...])``: a candidate server per slot of
    the sandbox's slot pool, so it fails closed, leases uids, retries starts and counts restarts as the judge
    pool does (``sandbox.slot_pool``)."""

    def __init__(self, limits: Limits | None = None, workers: int | None = None, unsafe: bool = False) -> None:
        self.slots = SlotPool((ROLE,), limits, workers, unsafe)
        self.limits, self.sandbox = self.slots.limits, self.slots.sandbox

    def run_all(self, batches: Sequence[Batch], on_done: Callable[[int, int], None] | None = None
                ) -> list[list[Call]]:
        """Results per batch, in input order; batches run in parallel, one per slot."""
        return self.slots.map(self._run, batches, on_done)

    def run(self, batch: Batch) -> list[Call]:
        return self.run_all([batch])[0]

    def _run(self, slot: Slot, batch: Batch) -> list[Call]:
        out: list[Call] = []
        timeouts = 0
        retried = -1
        n = len(batch.inputs)
        while len(out) < n:
            if batch.max_timeouts is not None and timeouts >= batch.max_timeouts:
                out += [Call("skipped")] * (n - len(out))
                break
            ended = self._sample(slot, batch, out)
            if ended is not None and (ended.status == "crashed" or ended.error == STARVED) and retried != len(out):
                # One child answers many inputs, so its CPU limit counts them all: a crash (SIGXCPU after many
                # good answers) may be the batch's doing, not this input's. It gets one fresh child, as does an
                # input the machine's load held back to the backstop.
                retried = len(out)
                continue
            if ended is not None:
                out.append(ended)
                timeouts += ended.status == "timeout"
                if ended.status == "load_error":
                    out += [Call("load_error", error=ended.error)] * (n - len(out))
        return out

    def _sample(self, slot: Slot, batch: Batch, out: list[Call]) -> Call | None:
        """Answer inputs from ``len(out)`` on in one child, appending to ``out``; the Call that ended the child
        early (timeout, crash, load error), or None when every input is answered."""
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        server = slot.server(ROLE)
        if server.meter is not None:
            server.meter.mark()
        started = time.monotonic()
        try:
            try:
                server.send_sample({"source": batch.source, "entry": batch.entry,
                                    "limits": self.limits.per_sample()}, [child.fileno()])
            finally:
                child.close()
            return self._calls(host, batch, out, server, started)
        except ServerDied as exc:
            slot.drop(ROLE)
            return Call("crashed", error=str(exc)[:300])
        finally:
            host.close()
            try:
                server.end_sample()
            except ServerDied:
                slot.drop(ROLE)

    def _calls(self, host: socket.socket, batch: Batch, out: list[Call], server: Server, started: float
               ) -> Call | None:
        meter = server.meter
        clock = LoadClock.started(LOAD_TIMEOUT_S, self.limits.backstop_s(LOAD_TIMEOUT_S), started)
        try:
            first = self._reply(host, clock, meter.read if meter is not None else lambda: None)
        except (ChannelClosed, ChannelTimeout, BadData) as exc:
            return Call("load_error", error=f"no ready: {exc}"[:300])
        if first != {"ready": True}:
            return Call("load_error", error=str(first.get("load_error", first))[:300])
        pid = meter.answering() if meter is not None else None
        base = process_usage(pid) if pid is not None else None

        def since_base() -> Usage | None:
            now = process_usage(pid) if pid is not None else None
            return now - base if now is not None and base is not None else None

        while len(out) < len(batch.inputs):
            i = len(out)
            clock = LoadClock.started(batch.budgets_s[i], self.limits.backstop_s(batch.budgets_s[i]))
            try:
                send_frame(host, {"args": encode_value(list(batch.inputs[i])), "kwargs": encode_value({})})
                reply = self._reply(host, clock, since_base)
            except ChannelTimeout as exc:
                return Call("timeout", error=str(exc), seconds=clock.own_s(time.monotonic()))
            except (ChannelClosed, BadData, OSError) as exc:
                return Call("crashed", error=str(exc)[:300], seconds=clock.own_s(time.monotonic()))
            elapsed, used = time.monotonic() - clock.start, since_base()
            seconds = elapsed - (credit(used, elapsed) if used is not None else 0.0)
            if used is not None and base is not None:
                base += used  # the reading now: the next call's start
            if type(reply.get("ok")) is str:
                try:
                    out.append(Call("ok", decode_value(reply["ok"]), seconds=seconds))
                except BadData as exc:
                    out.append(Call("not_plain", error=str(exc)[:300], seconds=seconds))
            elif "raise" in reply:
                raised = reply["raise"]
                text = ": ".join(str(x) for x in raised[1:]) if isinstance(raised, list) else str(raised)
                out.append(Call("raised", error=text[:300], seconds=seconds))
            else:
                out.append(Call("not_plain", error=str(reply.get("bad_result", reply))[:300], seconds=seconds))
        return None

    @staticmethod
    def _reply(host: socket.socket, clock: LoadClock, usage: Callable[[], Usage | None]) -> dict[str, Any]:
        """The child's next frame, within the clock; ChannelTimeout names how the clock ended the call."""
        ended = wait_readable(host, clock, usage)
        if ended is not None:
            raise ChannelTimeout(ended)
        return recv_frame(host, deadline=clock.frame_deadline())
