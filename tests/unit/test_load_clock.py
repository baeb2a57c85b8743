"""The load-aware wall clock (``sandbox.clock``) on given usage, and what ``sandbox.procstat`` reads from /proc for
real processes: CPU time of a tree, and the run-queue wait of a process that shares its core."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from codemill.sandbox.clock import POLL_S, STARVED, TIMED_OUT, LoadClock, credit
from codemill.sandbox.procstat import Meter, Usage, process_usage


def clock() -> LoadClock:
    return LoadClock.started(1.0, 10.0, start=100.0)


def test_a_busy_loop_on_an_idle_machine_times_out_at_its_budget():
    c = clock()
    assert c.deadline() == 101.0
    assert c.check(Usage(cpu_s=1.0, waited_s=0.0), now=101.0) == TIMED_OUT


def test_a_sleeping_program_times_out_at_its_budget_whatever_the_load():
    assert clock().check(Usage(cpu_s=0.0, waited_s=0.0), now=101.0) == TIMED_OUT


def test_time_the_load_took_moves_the_deadline_until_the_cpu_is_spent():
    c = clock()
    assert c.check(Usage(cpu_s=0.25, waited_s=0.75), now=101.0) is None  # a quarter of a core: own time 0.25 s
    assert c.credit_s == pytest.approx(0.75) and c.deadline() == pytest.approx(101.75)
    assert c.check(Usage(cpu_s=0.45, waited_s=1.3), now=101.75) is None
    assert c.check(Usage(cpu_s=1.0, waited_s=3.0), now=104.0) == TIMED_OUT  # a CPU second: its budget


def test_the_processes_cpu_time_is_always_the_samples_own():
    # waited 0.9 s, but its processes kept a core busy the whole second (its own helpers, say): no credit
    assert credit(Usage(cpu_s=1.0, waited_s=0.9), 1.0) == 0.0
    assert clock().check(Usage(cpu_s=1.0, waited_s=0.9), now=101.0) == TIMED_OUT
    assert credit(Usage(cpu_s=0.4, waited_s=0.9), 1.0) == pytest.approx(0.6)


def test_the_backstop_ends_a_sample_the_load_keeps_holding_back():
    c = clock()
    assert c.check(Usage(cpu_s=0.05, waited_s=9.9), now=110.0) == STARVED
    assert c.deadline() <= c.hard_deadline() == 110.0


def test_no_usage_means_no_credit():
    assert clock().check(None, now=101.0) == TIMED_OUT


def test_the_next_check_is_never_sooner_than_the_poll_interval():
    c = clock()
    assert c.check(Usage(cpu_s=0.99, waited_s=0.01), now=101.0) is None
    assert c.deadline() == pytest.approx(101.0 + POLL_S)


# --- procstat on real processes -----------------------------------------------------------------------------
def _python(code: str, cpu: int | None = None) -> subprocess.Popen:
    """A Python process in a session of its own (``_kill`` takes its children with it)."""
    pin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\n" if cpu is not None else ""
    return subprocess.Popen([sys.executable, "-c", pin + code], start_new_session=True)


def _kill(*procs: subprocess.Popen) -> None:
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_cpu_time_of_a_tree_counts_its_children_and_a_sleeper_uses_none():
    one = min(os.sched_getaffinity(0))
    parent = _python("import os, time\nif os.fork() == 0:\n    while True:\n        pass\ntime.sleep(60)\n", one)
    sleeper = _python("import time\ntime.sleep(60)\n")
    try:
        time.sleep(1.0)
        busy, idle = Meter.of_command(parent.pid), Meter.of_command(sleeper.pid)
        assert busy.answering() == parent.pid  # no PID namespace: the command itself answers
        assert busy.read().cpu_s > 0.1  # the forked child's loop counts
        assert idle.read().cpu_s < 0.1
        assert process_usage(parent.pid).cpu_s < 0.1  # alone, the parent (asleep) used next to nothing
    finally:
        _kill(parent, sleeper)


def test_a_process_sharing_its_core_waits_for_it():
    one = min(os.sched_getaffinity(0))
    spinners = [_python("while True:\n    pass\n", one) for _ in range(2)]
    try:
        time.sleep(1.0)
        usage = process_usage(spinners[0].pid)
        assert usage is not None and usage.waited_s > 0.1  # two on one core: each waits about half the time
        mark = Meter.of_command(spinners[0].pid)
        mark.mark()
        assert mark.read().waited_s < usage.waited_s  # counted from the mark on
    finally:
        _kill(*spinners)
    assert process_usage(spinners[0].pid) is None  # gone: nothing more to count
