"""The augmented tests' batch runner (``problems.plus.runner``) in the real sandbox, with every core busy: an
input's budget and its seconds are its own time, so which inputs the reference answers in time (and which
mutants time out) does not depend on how busy the machine is; a loop still times out."""

from __future__ import annotations

from codemill.problems.plus.runner import Batch, BatchRunner
from codemill.sandbox import Limits

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
