"""Rewards as a library call, for real in the judge pool: binary and partial credit, outcomes, durations, and the
per-batch count of samples that deserve a look."""

from __future__ import annotations

import contextlib
import os
import sys

import pytest

from codemill.problems.problem import ExecProblem
from codemill.problems.rewards import score
from codemill.sandbox import Limits, SandboxUnavailable
from codemill.sandbox.judge_pool import JudgePool

CASES = ["assert candidate(1, 2) == 3", "assert candidate(-1, 1) == 0", "assert candidate(0, 0) == 0",
         "assert candidate(2, 2) == 4"]
ADD = ExecProblem("add", "def add(a, b):\n", "add",
                  "def check(candidate):\n" + "".join(f"    {c}\n" for c in CASES), test_cases=CASES,
                  reference_solution="    return a + b\n", source="test", split_unit="arith")
NEG = ExecProblem("neg", "def neg(x):\n", "neg", "def check(candidate):\n    assert candidate(3) == -3\n",
                  reference_solution="    return -x\n", source="test", split_unit="arith")
PROBLEMS = {p.problem_id: p for p in (ADD, NEG)}


LIMITS = Limits(wall_s=2.0, cpu_s=1, memory_bytes=256 << 20)


@pytest.fixture(scope="module")
def pool():
    with JudgePool(LIMITS, workers=2) as p:
        yield p


def test_binary_and_partial_credit_per_sample(pool):
    batch = score(PROBLEMS, [("add", "    return a + b\n"), ("add", "    return abs(a) + b\n"),
                             ("add", "    return 0\n"), ("neg", "    return -x\n"), ("neg", "    return x\n")], pool)
    got = [(r.problem_id, r.sample_idx, r.passed, r.partial, r.outcome) for r in batch.rewards]
    assert got == [("add", 0, True, 1.0, "passed"), ("add", 1, False, 0.75, "failed"),
                   ("add", 2, False, 0.5, "failed"), ("neg", 0, True, 1.0, "passed"),
                   ("neg", 1, False, 0.0, "failed")]
    assert [r.reward for r in batch.rewards] == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert batch.pass_rate == pytest.approx(0.4)
    assert batch.suspicious == {}
    assert all(0 < r.duration_s < 2.0 for r in batch.rewards)
    assert "AssertionError" in batch.rewards[1].error


def test_suspicious_samples_are_counted_by_kind(pool):
    samples = [
        ("neg", "    while True:\n        pass\n"),  # loops: the wall clock or the CPU limit ends it
        ("neg", "    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n"),  # killed, not out of time
        ("neg", "    import os\n    os._exit(0)\n"),  # exits (status 0) instead of answering
        ("neg", "    return -x\nimport os\nos._exit(0)\n"),  # exits at load time
        ("neg", "    return -x\n"),
    ]
    batch = score(PROBLEMS, samples, pool)
    outcomes = [(r.outcome, r.suspicious) for r in batch.rewards]
    assert outcomes == [("timed_out", "timed_out"), ("failed", "killed"), ("failed", "exited"),
                        ("failed", "exited"), ("passed", None)]
    assert batch.suspicious == {"exited": 2, "killed": 1, "timed_out": 1}
    assert "SIGKILL" in batch.rewards[1].error and "status 0" in batch.rewards[2].error


def test_loops_and_sleepers_end_within_their_limits_on_a_busy_machine(pool, busy_cores):
    """With every core busy: a busy loop is not cut off before its CPU limit ends it (the load's time is not its
    own), well inside the backstop; a program that sleeps forever gets its wall clock and no more."""
    from codemill.sandbox.judge_pool import VERDICT_GRACE_S

    loop, sleeper = pool.judge_all([NEG.request("    while True:\n        pass\n"),
                                    NEG.request("    import time\n    time.sleep(1000)\n")])
    assert (loop.outcome, loop.error, loop.retried) == ("timed_out", "CPU limit (killed by SIGXCPU)", False)
    assert loop.duration_s < LIMITS.backstop_s() + VERDICT_GRACE_S + 3
    assert (sleeper.outcome, sleeper.kind, sleeper.error) == ("timed_out", "timed_out", "wall-clock limit")
    assert LIMITS.wall_s <= sleeper.duration_s < LIMITS.wall_s + VERDICT_GRACE_S + 3


@pytest.fixture
def one_cpu():
    """This process, every thread of it (and so every sandbox it starts from now on), on one CPU; then back."""
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    before = {tid: os.sched_getaffinity(tid) for tid in tids}
    one = {min(os.sched_getaffinity(0))}
    for tid in tids:
        os.sched_setaffinity(tid, one)
    yield
    for tid, cpus in before.items():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cpus)


def test_a_crowded_pool_still_passes_every_right_answer(one_cpu):
    """Sixteen workers on one CPU, sixteen right answers that need 1 s of CPU each: every one passes. Where the
    crowd holds a sample back to the backstop (2 x 1.5 s; run alone, about half of them), it is judged once more
    with nothing else of the pool running, and its row says it was retried; without that second judging those
    would be starved time-outs. How many reach the backstop depends on how the pool's starts overlap, so the
    count is not asserted."""
    slow_right = "    import time\n    t = time.process_time()\n    while time.process_time() - t < 1.0:\n" \
                 "        pass\n    return -x\n"
    with JudgePool(Limits(wall_s=1.5, cpu_s=5, backstop=2), workers=16) as crowded:
        judged = crowded.judge_all([NEG.request(slow_right)] * 16)
    assert [(j.outcome, j.kind) for j in judged] == [("passed", "passed")] * 16


def test_out_of_memory_is_its_own_outcome(pool):
    batch = score(PROBLEMS, [("neg", "    return bytearray(1 << 30)\n")], pool)
    assert [(r.outcome, r.suspicious) for r in batch.rewards] == [("killed_memory", "killed")]


def test_unknown_problem_ids_are_refused_before_anything_runs(pool):
    with pytest.raises(ValueError, match="nope"):
        score(PROBLEMS, [("neg", "    return -x\n"), ("nope", "")], pool)


def test_a_sandbox_that_cannot_start_fails_closed():
    pool = JudgePool(Limits(wall_s=1.0), workers=1)
    pool.sandbox.python = "/nonexistent/python3"
    with pytest.raises(SandboxUnavailable), pool:
        pass
    assert sys.executable  # the host interpreter is untouched


def test_a_dead_server_is_replaced_and_the_batch_completes(pool):
    """A candidate that kills its own fork server (its parent in the sandbox) fails, right answer or not (whether
    the answer got out before the sandbox came down is a race, so the verdict must not depend on it), is counted
    as killed, the server is replaced, and the samples after it are judged as usual."""
    kill_server = "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n    return {answer}\n"
    before = pool.restarts
    batch = score(PROBLEMS, [("neg", kill_server.format(answer="-x")), ("neg", "    return -x\n"),
                             ("neg", kill_server.format(answer="x")), ("neg", "    return x\n")] * 2, pool)
    assert [r.passed for r in batch.rewards] == [False, True, False, False] * 2
    assert [r.outcome for r in batch.rewards] == ["failed"] + ["passed"] + ["failed"] * 2 + ["failed"] + [
        "passed"] + ["failed"] * 2
    assert batch.suspicious == {"killed": 4}
    assert pool.restarts >= before + 4


UNITTEST_TESTS = '''import io
import statistics
import unittest


def check(candidate):
    class T(unittest.TestCase):
        def test_mean(self):
            self.assertEqual(candidate([1, 2, 3]), 2)

        def test_empty(self):
            with self.assertRaises(statistics.StatisticsError):
                candidate([])

    result = unittest.TextTestRunner(stream=io.StringIO()).run(unittest.defaultTestLoader.loadTestsFromTestCase(T))
    assert result.wasSuccessful()
'''
MEAN = ExecProblem("mean", "def mean(xs):\n", "mean", UNITTEST_TESTS,
                   reference_solution="    import statistics\n    return statistics.mean(xs)\n", source="test")


def test_exceptions_cross_with_their_type_but_a_skip_never_does(pool):
    """statistics.StatisticsError (the tests import statistics) reaches assertRaises as itself; a candidate
    raising SkipTest would make a unittest run 'successful' (skips are not failures) if the judge rebuilt it."""
    skip = "    import unittest\n    raise unittest.SkipTest('not today')\n"
    batch = score({"mean": MEAN}, [("mean", MEAN.reference_solution or ""), ("mean", skip)], pool)
    assert [(r.passed, r.outcome) for r in batch.rewards] == [(True, "passed"), (False, "failed")]
