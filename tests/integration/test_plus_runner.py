"""The augmented tests' batch runner (``problems.plus.runner``) in the real sandbox. With every core busy, an
input's budget and its seconds are its own time, so which inputs the reference answers in time (and which
mutants time out) does not depend on how busy the machine is; a loop still times out. Its slots are the
sandbox's slot pool, the judge pool's: dead servers are replaced and counted, failed starts tried again."""

from __future__ import annotations

import pytest

from codemill import metrics
from codemill.problems.plus.runner import Batch, BatchRunner
from codemill.sandbox import Limits, SandboxUnavailable
from codemill.sandbox.slot_pool import START_ATTEMPTS

SOURCE = "def total(n):\n    s = 0\n    for i in range(n):\n        s += i\n    return s\n"
LOOP = "def total(n):\n    while True:\n        pass\n"
STEPS = 6_000_000  # about 0.3 s of CPU: under half its budget alone, twice all of it at a fifth of a core
BUDGET_S = 0.75


def test_budgets_and_seconds_are_the_calls_own_time_on_a_busy_machine(busy_cores):
    with BatchRunner(Limits(wall_s=10.0, cpu_s=10), workers=1) as runner:
        calls = runner.run(Batch(SOURCE, "total", [(STEPS,), (10,), (-1,)], [BUDGET_S] * 3))
        [loop] = runner.run(Batch(LOOP, "total", [(10,)], [BUDGET_S]))
    assert [(c.status, c.value) for c in calls] == [("ok", STEPS * (STEPS - 1) // 2), ("ok", 45), ("ok", 0)]
    assert 0 < calls[0].seconds < BUDGET_S
    assert (loop.status, loop.error) == ("timeout", "timed_out")
    assert loop.seconds >= BUDGET_S


KILLS_ITS_SERVER = ("import os, signal, time\ndef total(n):\n    if n < 0:\n"
                    "        os.kill(os.getppid(), signal.SIGKILL)\n"
                    "        time.sleep(60)\n"  # no answer gets out before the sandbox comes down
                    "    return n\n")


def test_a_server_the_program_kills_is_replaced_and_counted():
    """A program that kills its own fork server (its parent in the sandbox) crashes that input, in its first child
    and in the fresh one a crash gets; each dead server is replaced and counted as a restart, in the runner and in
    the metrics, and the inputs after it are answered."""
    with metrics.collecting() as registry, BatchRunner(Limits(wall_s=10.0, cpu_s=10), workers=1) as runner:
        assert registry.get_sample_value("codemill_sandbox_slots") == 1
        calls = runner.run(Batch(KILLS_ITS_SERVER, "total", [(1,), (-1,), (2,)], [5.0] * 3))
        assert [(c.status, c.value) for c in calls] == [("ok", 1), ("crashed", None), ("ok", 2)]
        assert runner.restarts == 2
        assert registry.get_sample_value("codemill_sandbox_server_restarts_total") == 2
    assert registry.get_sample_value("codemill_sandbox_slots") == 0


def test_a_server_that_cannot_start_is_tried_again_and_counted_before_the_run_fails_closed():
    """The first slot's server starts when the runner opens; the second slot's starts at its first batch, here
    with an interpreter that is not there: every try fails and counts, then the run fails closed."""
    with metrics.collecting() as registry, BatchRunner(Limits(wall_s=10.0, cpu_s=10), workers=2) as runner:
        runner.sandbox.python = "/nonexistent/python3"
        with pytest.raises(SandboxUnavailable, match="candidate sandbox server did not start"):
            runner.run_all([Batch(SOURCE, "total", [(10,)], [BUDGET_S])] * 2)
    assert START_ATTEMPTS > 1
    assert registry.get_sample_value("codemill_sandbox_probe_failures_total") == START_ATTEMPTS
    assert registry.get_sample_value("codemill_sandbox_slots") == 0
