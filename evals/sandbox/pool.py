"""Run many programs in parallel sandboxes, one worker slot (and sandbox uid) per concurrent program."""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from codemill.cpus import usable_cpus
from codemill.evals.sandbox.runner import ExecResult, Sandbox


def default_workers() -> int:
    return usable_cpus()


def run_all(sandbox: Sandbox, programs: Sequence[str], workers: int | None = None,
            on_done: Callable[[int, int], None] | None = None) -> list[ExecResult]:
    """Results in input order. Threads only wait on subprocesses, so one thread per core is enough."""
    workers = workers or default_workers()
    slots: queue.Queue[int] = queue.Queue()
    for s in range(workers):
        slots.put(s)
    done = [0]

    def one(program: str) -> ExecResult:
        slot = slots.get()
        try:
            return sandbox.run(program, slot=slot)
        finally:
            slots.put(slot)
            done[0] += 1
            if on_done:
                on_done(done[0], len(programs))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, programs))
