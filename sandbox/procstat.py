"""What the kernel says one sandbox's processes used, read on the host from /proc.

Two numbers per sample (``Usage``): the CPU time of all the sample's processes (reaped ones included), and how
long the sample's *answering* process (the one that runs its code and answers the judge) and the sandbox's own
machinery (the fork server that starts it) were ready to run but waited on a run queue for a CPU (``run_delay``
in ``/proc/<pid>/schedstat``): time the machine's load took from them, not time they spent. Both come from the
kernel's accounting of the processes, so a sandboxed program can change neither; it can rename itself, which
``_fields`` parses around.

A sandbox is the process tree under the bwrap that ``Popen`` started (``root``): bwrap, its init in the new PID
namespace (``NSpid`` 1) and the command under it. ``anchor`` is the process whose children run the sample (a
fork server; for a one-shot command, bwrap's init), and it and its ancestors are the sandbox's own machinery: of
them only what they reaped during the sample counts (orphans the sample left, reaped by init).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
UTIME, CUTIME, STARTTIME = 11, 13, 19  # indices into /proc/<pid>/stat after the command name (fields 14, 16, 22)


@dataclass(frozen=True)
class Usage:
    cpu_s: float  # CPU time (user + system) of the sample's processes
    waited_s: float  # time the answering process and the machinery were runnable but waiting for a CPU

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.cpu_s + other.cpu_s, self.waited_s + other.waited_s)

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.cpu_s - other.cpu_s, self.waited_s - other.waited_s)


ZERO = Usage(0.0, 0.0)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:  # the process is gone (or never was): it has nothing more to count
        return None


def _fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from the state on (the name before it is the program's to choose, parens included)."""
    text = _read(f"/proc/{pid}/stat")
    if text is None or ")" not in text:
        return None
    return text[text.rindex(")") + 2:].split()


def children(pid: int) -> list[int]:
    """Every thread's children: a process forked from a thread other than the main one is listed only there."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [int(c) for t in tasks for c in (_read(f"/proc/{pid}/task/{t}/children") or "").split()]


def descendants(root: int) -> list[int]:
    """``root`` and every process under it."""
    out, todo, seen = [], [root], {root}
    while todo:
        pid = todo.pop()
        out.append(pid)
        for child in children(pid):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return out


def ns_pid(pid: int) -> int | None:
    """The process's pid in its innermost PID namespace (the last of ``NSpid``)."""
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return None


def _ancestry(anchor: int, root: int) -> frozenset[int]:
    """``anchor`` and its parents up to ``root`` (all of them when ``root`` is not above it)."""
    out, pid = {anchor}, anchor
    while pid != root:
        fields = _fields(pid)
        if fields is None or int(fields[1]) <= 1:
            break
        pid = int(fields[1])
        out.add(pid)
    return frozenset(out)


def waited_s(pid: int) -> float:
    """run_delay of the process's main thread, in seconds (0 when it is gone)."""
    text = _read(f"/proc/{pid}/schedstat")
    parts = text.split() if text else []
    return int(parts[1]) / 1e9 if len(parts) >= 2 else 0.0


def _cpu_s(fields: list[str], own: bool = True) -> float:
    """CPU time of a process's reaped children, and with ``own`` its own (user + system)."""
    return sum(int(x) for x in fields[UTIME if own else CUTIME:CUTIME + 2]) * TICK_S


def process_usage(pid: int) -> Usage | None:
    """One process alone (and the children it reaped): two small reads, cheap enough for every call of a batch
    of trusted code. None when it is gone."""
    fields = _fields(pid)
    return None if fields is None else Usage(_cpu_s(fields), waited_s(pid))


class Meter:
    """One sandbox's ``Usage`` since ``mark()`` (since the processes started, before any mark)."""

    def __init__(self, root: int, anchor: int | None) -> None:
        self.root = root
        self.anchor = anchor
        self.machinery = _ancestry(anchor, root) if anchor is not None else frozenset()
        self.base = ZERO

    @classmethod
    def of_server(cls, root: int, server_ns_pid: int) -> Meter | None:
        """A fork server's sandbox: the anchor is the server, found by the pid it reports from inside."""
        found = [p for p in descendants(root) if ns_pid(p) == server_ns_pid]
        return cls(root, found[0]) if len(found) == 1 else None

    @classmethod
    def of_command(cls, root: int) -> Meter:
        """A one-shot command's sandbox: the anchor is bwrap's init; without a PID namespace (unsafe mode) the
        command is ``root`` itself and answers."""
        inits = [p for p in descendants(root) if p != root and ns_pid(p) == 1]
        return cls(root, inits[0] if inits else None)

    def answering(self) -> int | None:
        """The sample's own process: the anchor's oldest child (orphans it adopts are younger), else root."""
        if self.anchor is None:
            return self.root
        kids = [(int(f[STARTTIME]), pid) for pid in children(self.anchor) if (f := _fields(pid)) is not None]
        return min(kids)[1] if kids else None

    def total(self) -> Usage:
        cpu = 0.0
        for pid in descendants(self.root):
            fields = _fields(pid)
            if fields is not None:  # the machinery's own work is not the sample's
                cpu += _cpu_s(fields, own=pid not in self.machinery)
        answering = self.answering()
        waited = sum(waited_s(pid) for pid in self.machinery)  # the server's start of the sample (recv, fork)
        return Usage(cpu, waited + (waited_s(answering) if answering is not None else 0.0))

    def mark(self) -> Usage:
        """Count from now on; returns the reading (the totals so far)."""
        self.base = self.total()
        return self.base

    def read(self) -> Usage:
        return self.total() - self.base
