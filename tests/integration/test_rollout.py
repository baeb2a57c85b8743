"""Rollouts rewarded in the real bubblewrap sandbox: known-correct and known-wrong completions, judging overlapped
with generation, a judge lost mid-sample judged again, a sandbox that stops starting fails the collection
(the Ray fan-out: test_rollout_ray.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from codemill.models.engines import Completion, HFEngine, RolloutParams, teacher_forced_logprobs
from codemill.problems.problem import ExecProblem
from codemill.problems.synthetic import synthetic_problems
from codemill.rl.envs import env_for
from codemill.rl.rollout import collect_rollouts, judge
from codemill.rl.trajectory import read_rollouts, write_rollouts
from codemill.sandbox import Limits, SandboxUnavailable
from codemill.sandbox.judge_pool import JudgePool

pytestmark = [pytest.mark.usefixtures("one_torch_thread")]

PROBLEMS = synthetic_problems(5, 4)
LIMITS = Limits(wall_s=3.0, cpu_s=2, memory_bytes=256 << 20)


class ScriptedEngine:
    """Replays given completion texts as samples, with the token ids and contract log-probs of a real policy (a
    teacher-forced pass), so the rewards of known answers go through the real collection path."""

    def __init__(self, policy: Path, answers: dict[str, list[str]]) -> None:
        self.hf = HFEngine(policy)
        self.answers = answers  # prompt -> the k completion texts
        self.calls: list[int] = []

    @property
    def tokenizer(self):
        return self.hf.tokenizer

    @property
    def max_context(self) -> int:
        return self.hf.max_context

    def generate_ids(self, contexts: Sequence[Sequence[int]], k: int, params: RolloutParams,
                     seeds: Sequence[int]) -> list[list[Completion]]:
        self.calls.append(len(contexts))
        by_ids = {tuple(self.hf.encode(prompt, params.max_new_tokens)): texts for prompt, texts in self.answers.items()}
        out = []
        for p_ids in contexts:
            group = []
            for text in by_ids[tuple(p_ids)][:k]:
                ids = self.hf.tokenizer(text, add_special_tokens=False)["input_ids"]
                lps = teacher_forced_logprobs(self.hf.model, p_ids, ids, params.temperature)
                group.append(Completion(text, list(p_ids), ids, lps, "length"))
            out.append(group)
        return out

    def generate(self, prompts: Sequence[str], k: int, params: RolloutParams,
                 seeds: Sequence[int]) -> list[list[Completion]]:
        return self.generate_ids([self.hf.encode(p, params.max_new_tokens) for p in prompts], k, params, seeds)

    def load_weights(self, hf_dir: str | Path) -> None:
        self.hf.load_weights(hf_dir)


@pytest.fixture(scope="module")
def pool():
    with JudgePool(LIMITS, workers=1) as p:
        yield p


def _wrong_on_one_case(p: ExecProblem) -> str:
    """A body that passes every test case but the first (partial credit (n-1)/n)."""
    first = p.test_cases[0].removeprefix("assert candidate(").rsplit(") == ", 1)[0]
    arg = p.prompt.split("(", 1)[1].split(":", 1)[0]
    return f"    if {arg} == {first}:\n        return None\n{p.reference_solution}"


def test_rewards_of_known_completions_through_the_sandbox(policy, pool, tmp_path):
    answers = {p.prompt: [p.reference_solution or "", "    return None\n", _wrong_on_one_case(p)] for p in PROBLEMS}
    engine = ScriptedEngine(policy, answers)
    params = RolloutParams(temperature=0.8, max_new_tokens=64)
    env = env_for(None, engine, pool, params.max_new_tokens)
    rows, timings = collect_rollouts(engine, env, PROBLEMS, 3, params, seed=1, batch_problems=2)
    assert engine.calls == [2, 2]  # two fixed batches of two problems
    assert [(r["group"], r["sample"]) for r in rows] == [(g, s) for g in range(4) for s in range(3)]
    for g, p in enumerate(PROBLEMS):
        right, wrong, partly = rows[3 * g:3 * g + 3]
        assert {r["problem_id"] for r in (right, wrong, partly)} == {p.problem_id}
        assert (right["reward"], right["partial"], right["outcome"]) == (1.0, 1.0, "passed")
        assert (wrong["reward"], wrong["partial"], wrong["outcome"]) == (0.0, 0.0, "failed")
        n = len(p.test_cases)
        assert (partly["reward"], partly["outcome"]) == (0.0, "failed")
        assert partly["partial"] == pytest.approx((n - 1) / n)
        assert right["completion"] == p.reference_solution and right["prompt"] == p.prompt
        assert all(r["suspicious"] == "" and r["duration_s"] > 0 for r in (right, wrong, partly))
    assert timings.samples == 12 and timings.batches == 2 and timings.rejudged == 0
    assert timings.tokens == sum(len(r["completion_ids"]) for r in rows)
    assert timings.generation_s > 0 and timings.reward_s > 0 and timings.wall_s > 0
    assert timings.samples_per_s == pytest.approx(12 / timings.wall_s)
    table = read_rollouts(write_rollouts(rows, tmp_path / "rollouts.parquet"))
    assert table.column("reward").to_pylist() == [r["reward"] for r in rows]


def test_model_rollouts_overlapped_or_not_are_the_same(policy, pool, tmp_path, monkeypatch):
    """The real engine end to end: rows of every mode equal (but the judge's timings). With overlap the first batch
    is still being judged when the engine has moved on to the next one; without, it is judged before. With two
    generation threads two batches are generated at the same time."""
    import codemill.rl.rollout as rollout

    engine = HFEngine(policy)
    params = RolloutParams(temperature=1.0, max_new_tokens=24, stop=("\ndef",))
    judged_until: list[float] = []
    real_judge = rollout.judge_counted

    def timed_judge(*args, **kwargs):  # observes only: the real judge runs
        try:
            return real_judge(*args, **kwargs)
        finally:
            judged_until.append(time.monotonic())

    monkeypatch.setattr(rollout, "judge_counted", timed_judge)
    real_generate = engine.generate_ids
    generating: list[tuple[float, float]] = []  # when the engine started and ended a batch's generation

    def timed_generate(*args, **kwargs):  # observes only: the real engine samples
        start = time.monotonic()
        try:
            return real_generate(*args, **kwargs)
        finally:
            generating.append((start, time.monotonic()))

    monkeypatch.setattr(engine, "generate_ids", timed_generate)
    runs = {}
    for overlap, generators in ((True, 1), (False, 1), (True, 2)):
        judged_until.clear()
        generating.clear()
        finished: list[int] = []
        env = env_for(None, engine, pool, params.max_new_tokens)
        runs[overlap, generators] = collect_rollouts(engine, env, PROBLEMS, 2, params, seed=3, batch_problems=1,
                                                     overlap=overlap, generators=generators,
                                                     on_batch=lambda i, n, f=finished: f.append(i))
        assert finished == [1, 2, 3, 4] and len(generating) == 4
        spans = sorted(generating)
        at_once = any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
        assert at_once is (generators == 2)
        if generators == 1:
            first_judged, second_generated = judged_until[0], spans[1][0]
            assert (first_judged > second_generated) is overlap
    (rows_o, t_o), (rows_s, t_s), (rows_2, t_2) = runs[True, 1], runs[False, 1], runs[True, 2]

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "duration_s"} for r in rows]

    assert strip(rows_o) == strip(rows_s) == strip(rows_2)
    assert len(rows_o) == 8 and {r["finish_reason"] for r in rows_o} <= {"stop", "eos", "length"}
    assert all(r["reward"] == 0.0 for r in rows_o)  # an untrained model solves nothing
    assert t_o.overlap and not t_s.overlap and t_o.tokens == t_s.tokens == t_2.tokens
    assert t_2.samples == 8
    # Without overlap generation waits for every judging; with it, only for what is left after the last batch.
    assert t_s.reward_wait_s == pytest.approx(t_s.reward_s, abs=0.05) and t_o.reward_wait_s < t_o.reward_s
    write_rollouts(rows_o, tmp_path)
    assert read_rollouts(tmp_path).num_rows == 8


def test_an_iteration_samples_the_same_rows_whatever_rl_rollout_threads_is(policy):
    """Through the flow's own path (``collect_iteration``): one batch at a time or two at once, each batch on one
    torch thread whatever torch had before (restored after), so the rows are the same."""
    import torch

    from codemill.rl.collect import collect_iteration
    from codemill.rl.config import RLConfig, RolloutConfig

    torch.set_num_threads(2)
    runs = []
    for threads in (1, 2):
        cfg = RLConfig(rollout=RolloutConfig(max_new_tokens=12, samples_per_problem=2, problems_per_iteration=4,
                                             batch_problems=1, threads=threads))
        rows, timings = collect_iteration(cfg, PROBLEMS, str(policy), seed=9, k=2)
        assert torch.get_num_threads() == 2 and timings["engine"] == "hf" and timings["weight_sync_s"] > 0
        runs.append([{k: v for k, v in r.items() if k != "duration_s"} for r in rows])
    assert len(runs[0]) == 8 and runs[0] == runs[1]


def test_a_failed_generation_leaves_no_sample_in_flight(policy, pool):
    """A batch whose generation fails stops the collection with the engine's error, and the in-flight gauge
    comes back to 0 (what a started batch put on, its failure takes off), with two batches generating at once."""
    from codemill import metrics

    engine = HFEngine(policy)
    real_generate = engine.generate_ids
    calls: list[int] = []

    def failing_generate(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the engine ran out of memory")
        return real_generate(*args, **kwargs)

    engine.generate_ids = failing_generate  # type: ignore[method-assign]
    params = RolloutParams(temperature=1.0, max_new_tokens=8)
    with metrics.collecting() as registry:
        env = env_for(None, engine, pool, params.max_new_tokens)
        with pytest.raises(RuntimeError, match="out of memory"):
            collect_rollouts(engine, env, PROBLEMS, 2, params, seed=3, batch_problems=1, generators=2)
        assert registry.get_sample_value("codemill_rollout_samples_in_flight") == 0.0
        assert registry.get_sample_value("codemill_rollout_samples_total") > 0  # some batches did generate


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                status = (d / "status").read_text()
            except OSError:
                continue
            uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
            if int(uids[0]) == uid:
                pids.append(int(d.name))
    return pids


def _kill_the_judge_soon(pool: JudgePool, after_s: float) -> threading.Thread:
    """SIGKILL every process of the slot's judge (its server and the sample it runs), by pid: they run as the
    judge's own leased uid, which nothing else on the machine uses while the pool holds it."""

    def kill() -> None:
        time.sleep(after_s)
        pids = _pids_of_uid(pool.slots._all[0].uids["judge"])
        assert pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    t = threading.Thread(target=kill)
    t.start()
    return t


def test_a_judge_lost_mid_sample_is_judged_again():
    """The judge server dies while a correct sample runs (the host gets no verdict): the sample is judged again on
    a fresh server and passes. Without retries the same event costs the sample its reward."""
    p = PROBLEMS[0]
    slow = (p.reference_solution or "") + "import time\ntime.sleep(1.0)\n"  # slow to load, once
    for retries, expected in ((2, (True, None)), (0, (False, "no_verdict"))):
        with JudgePool(LIMITS, workers=1) as pool:
            pool.slots._all[0].server("judge")
            killer = _kill_the_judge_soon(pool, 0.4)
            rewards, rejudged = judge([p, p], [slow, p.reference_solution or ""], pool, retries=retries)
            killer.join()
            assert (rewards[0].passed, rewards[0].suspicious) == expected
            assert rewards[1].passed and rejudged == (1 if retries else 0)
            assert pool.restarts >= 1


def test_a_sample_that_kills_its_own_server_does_not_stop_the_batch(policy, pool):
    """A completion that SIGKILLs its candidate server (its parent in the sandbox): the server is replaced and the
    honest samples around it keep their rewards; the collection completes."""
    kill = "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n"
    answers = {q.prompt: [kill + (q.reference_solution or ""), q.reference_solution or ""] * 2 for q in PROBLEMS}
    before = pool.restarts
    engine, params = ScriptedEngine(policy, answers), RolloutParams(max_new_tokens=64)
    rows, timings = collect_rollouts(engine, env_for(None, engine, pool, params.max_new_tokens), PROBLEMS, 4, params,
                                     seed=0, batch_problems=2)
    assert len(rows) == 16 and timings.batches == 2
    assert [r["reward"] for r in rows if r["sample"] % 2] == [1.0] * 8
    assert pool.restarts >= before + 8


def test_a_sandbox_that_cannot_start_fails_the_collection_closed(policy):
    """Servers that die and cannot be restarted raise SandboxUnavailable: no rows of zero rewards."""
    answers = {p.prompt: [p.reference_solution or ""] for p in PROBLEMS}
    with JudgePool(LIMITS, workers=1) as pool:
        pool.sandbox.python = "/nonexistent/python3"  # every restart now fails
        for role in ("candidate", "judge"):
            pool.slots._all[0].drop(role)
        with pytest.raises(SandboxUnavailable):
            engine = ScriptedEngine(policy, answers)
            collect_rollouts(engine, env_for(None, engine, pool, 32), PROBLEMS, 1, RolloutParams(max_new_tokens=32),
                             seed=0, batch_problems=2)
