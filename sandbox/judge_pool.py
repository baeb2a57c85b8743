"""Judge samples on long-lived sandbox servers: a candidate server and a judge server per worker slot.

Per sample the host makes two socketpairs (judge <-> candidate, and judge -> host for the verdict), hands
one end of the first to the candidate server and the other end plus the verdict end to the judge server,
and keeps only its verdict end. The verdict is the only thing that can make a sample pass, and it comes from
the judge's process, which the candidate's code cannot reach (another sandbox, another uid, and a channel
that carries plain data only). How the candidate's process ended only *names* a failure (timed out, out of
memory, exited), never turns one into a pass.

Process reuse keeps samples apart: each sample runs in a fresh fork of each server, and a server answers
"done" only after it has killed the sample's leftovers and emptied the writable folders, before the next
sample starts. A server that dies or hangs is replaced with a fresh sandbox.

The wall clock of a sample counts its own time, not the time the machine's load made its candidate and judge
processes wait for a CPU (``clock.LoadClock``), so a correct but slow-ish sample on a busy machine is not judged
timed out. A sample the load held back to the clock's hard backstop is judged once more at the end of the batch,
with nothing else of the pool running, and that verdict counts (``Judged.retried``).
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from codemill import metrics
from codemill.sandbox.clock import STARVED, TIMED_OUT, LoadClock, wait_readable
from codemill.sandbox.limits import Limits
from codemill.sandbox.procstat import Usage
from codemill.sandbox.request import JudgeRequest
from codemill.sandbox.runner import BACKSTOP_ERROR, Outcome
from codemill.sandbox.servers import ServerDied
from codemill.sandbox.slot_pool import OnSlots, Slot, SlotPool
from codemill.sandbox.wire import BadData, ChannelClosed, ChannelTimeout, recv_frame

VERDICT_GRACE_S = 0.5
ROLES = ("candidate", "judge")


@dataclass(frozen=True)
class Judged:
    """One sample's verdict, as the host saw it. ``kind`` is the judge's (or the host's) word for it."""

    outcome: Outcome
    passed: bool
    partial: float
    kind: str
    error: str
    duration_s: float
    candidate: dict[str, Any]
    waited_s: float = 0.0  # time the load made it wait for a CPU, not counted against its wall clock
    retried: bool = False  # judged a second time, alone, after the load held it back to the backstop

    @property
    def suspicious(self) -> str | None:
        """Why this sample deserves a look (None for an ordinary pass or failure)."""
        if self.kind == STARVED:
            return STARVED
        if self.outcome is Outcome.TIMED_OUT:
            return "timed_out"
        died = self.candidate.get("ended_by") == "itself" and self.candidate.get("signal") is not None
        if self.outcome is Outcome.KILLED_MEMORY or died or self.kind == "server_killed":
            return "killed"
        if self.kind == "candidate_gone":
            return "exited"
        if self.kind in ("no_verdict", "judge_error", "bad_data"):
            return self.kind
        return None


class JudgePool(OnSlots):
    """``with JudgePool(limits) as pool: pool.judge_all([JudgeRequest(...), ...])``. Fails closed: the sandbox is
    probed (no network, the servers up under their own uids) before any sample runs (``slot_pool``)."""

    def __init__(self, limits: Limits | None = None, workers: int | None = None, unsafe: bool = False) -> None:
        self.slots = SlotPool(ROLES, limits, workers, unsafe)
        self.limits, self.sandbox = self.slots.limits, self.slots.sandbox

    def judge_all(self, requests: Sequence[JudgeRequest],
                  on_done: Callable[[int, int], None] | None = None) -> list[Judged]:
        """Verdicts in input order; one thread per slot (threads only wait on sockets). Samples the load held
        back to the backstop are judged again afterwards, one at a time, and that second verdict counts."""
        m = metrics.get()

        def one(slot: Slot, request: JudgeRequest) -> Judged:
            judged = self._judge(slot, request)
            if judged.kind != STARVED:
                count_verdict(m, judged)
            return judged

        judged = self.slots.map(one, requests, on_done)
        starved = [i for i, j in enumerate(judged) if j.kind == STARVED]
        if starved:
            with self.slots.borrow() as slot:
                for i in starved:
                    judged[i] = replace(self._judge(slot, requests[i]), retried=True)
                    count_verdict(m, judged[i])
        return judged

    def _judge(self, slot: Slot, request: JudgeRequest) -> Judged:
        limits = self.limits.per_sample()
        candidate, judge = slot.server("candidate"), slot.server("judge")
        meters = [candidate.meter, judge.meter]
        t0 = time.monotonic()
        for meter in meters:
            if meter is not None:
                meter.mark()

        def usage() -> Usage | None:  # both sides: the candidate's answers and the judge's tests take turns
            if candidate.meter is None or judge.meter is None:
                return None
            return candidate.meter.read() + judge.meter.read()

        clock = LoadClock.started(self.limits.wall_s + VERDICT_GRACE_S,
                                  self.limits.backstop_s() + VERDICT_GRACE_S, t0)
        to_judge, to_candidate = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        verdict_host, verdict_judge = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        verdict: dict[str, Any] | None = None
        host_kind = ""
        sent: list[str] = []
        try:
            try:
                candidate.send_sample({"source": request.program, "entry": request.entry_point,
                                       "limits": limits}, [to_candidate.fileno()])
                sent.append("candidate")
                judge.send_sample({"prompt": request.prelude, "tests": request.tests,
                                   "test_cases": list(request.test_cases), "entry": request.entry_point,
                                   "limits": limits}, [to_judge.fileno(), verdict_judge.fileno()])
                sent.append("judge")
            finally:
                for s in (to_judge, to_candidate, verdict_judge):
                    s.close()
            try:
                host_kind = wait_readable(verdict_host, clock, usage) or ""
                if not host_kind:
                    reply = recv_frame(verdict_host, deadline=clock.frame_deadline())
                    verdict = reply.get("verdict") if isinstance(reply.get("verdict"), dict) else None
                    host_kind = "" if verdict else "no_verdict"
            except ChannelTimeout:
                host_kind = TIMED_OUT
            except (ChannelClosed, BadData):
                host_kind = "no_verdict"
        except ServerDied:
            host_kind = "no_verdict"
            slot.drop("judge" if "candidate" in sent else "candidate")
        finally:
            verdict_host.close()
        duration = time.monotonic() - t0
        cand_info = self._end(slot, "candidate") if "candidate" in sent else {}
        if "judge" in sent:
            self._end(slot, "judge")
        judged = _label(verdict, host_kind, cand_info, round(duration, 4), self.limits.cpu_s)
        return replace(judged, waited_s=round(clock.credit_s, 4))

    def _end(self, slot: Slot, role: str) -> dict[str, Any]:
        server = slot.servers[role]
        if server is None:
            return {}
        try:
            return server.end_sample()
        except ServerDied:
            slot.drop(role)
            return {"server_died": True}


def count_verdict(m: metrics.Metrics, judged: Judged) -> None:
    m.sandbox_verdict_seconds.observe(judged.duration_s)
    m.sandbox_verdicts.labels(judged.outcome.value).inc()
    if judged.suspicious:
        m.sandbox_suspicious_samples.labels(judged.suspicious).inc()


def _label(verdict: dict[str, Any] | None, host_kind: str, cand: dict[str, Any], duration: float,
           cpu_limit_s: float) -> Judged:
    """The sample's outcome. Only a judge verdict of kind "passed" with passed=True is a pass. A candidate
    killed by SIGXCPU, or by SIGKILL once it used its CPU seconds (the hard limit), ran out of time; one that
    was SIGKILLed earlier was killed (by itself, or by the memory limit's OOM path). A sample whose candidate
    server died under it fails whatever the judge saw: only the sample's own code (or what it left running) can
    kill that server, and whether its answers got out before the sandbox came down with the server is a race,
    so a verdict either way would be noise."""
    if cand.get("server_died"):
        return Judged(Outcome.FAILED, False, 0.0, "server_killed",
                      "the candidate's sandbox server died during the sample", duration, cand)
    if verdict is None:
        kind = host_kind or "no_verdict"
        outcome = Outcome.TIMED_OUT if kind in (TIMED_OUT, STARVED) else Outcome.FAILED
        error = {TIMED_OUT: "wall-clock limit", STARVED: BACKSTOP_ERROR}.get(kind, "the judge wrote no verdict")
        return Judged(outcome, False, 0.0, kind, error, duration, cand)
    kind = str(verdict.get("kind", "bad_verdict"))
    error = str(verdict.get("error", ""))[:500]
    partial = verdict.get("partial", 0.0)
    partial = float(partial) if type(partial) in (int, float) and 0.0 <= partial <= 1.0 else 0.0
    if kind == "passed" and verdict.get("passed") is True:
        return Judged(Outcome.PASSED, True, partial, kind, "", duration, cand)
    outcome = Outcome.FAILED
    if kind == "candidate_gone":
        sig, code = cand.get("signal"), cand.get("exit")
        out_of_cpu = float(cand.get("cpu_s") or 0.0) >= cpu_limit_s
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cand.get("ended_by") == "itself" and out_of_cpu):
            outcome, error = Outcome.TIMED_OUT, f"CPU limit (killed by {signal.Signals(sig).name})"
        elif sig is not None:
            error = f"the candidate was killed by {signal.Signals(sig).name}"
        elif code is not None:
            error = f"the candidate exited with status {code} before answering"
    elif error.startswith("MemoryError"):
        outcome = Outcome.KILLED_MEMORY
    return Judged(outcome, False, partial, kind, error, duration, cand)
