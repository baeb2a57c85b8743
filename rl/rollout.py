"""Rollouts for RL: k episodes per problem in an environment (``codemill.rl.env``), sampled by a
``RolloutEngine`` token in, token out, written as the contract's rollouts table (``codemill.rl.trajectory``).

``collect_rollouts`` walks the problems in fixed batches (``batch_problems`` consecutive groups; a problem's
group is its index in the iteration). A batch's turn is generated on one of ``generators`` threads and stepped
(judged) on a background one, so judging one batch overlaps generating others: a batch whose step came back with
live episodes gets its next turn first, otherwise the next batch starts (``overlap=False`` steps each turn before
generating anything else: the benchmark's reference). A batch's tokens depend on nothing but the batch, so the
rows are the same for any number of generation threads. A group's first turn is sampled with
``derive_seed(seed, group)`` for its k samples; later turns with the episode's own seed and the turn, so the
samples do not depend on the batching, the order or the worker (``rollout_ray`` shards whole batches over Ray).

Rewards fail closed: a sandbox that cannot start raises (``SandboxUnavailable``), never zero rewards. A sample the
host could not get a verdict for (the judge server lost mid-sample: kinds ``no_verdict`` / ``judge_error``; the
candidate cannot reach the judge's process, so these are the grader's failures, not the sample's) is judged
again, up to ``reward_retries`` times, on the pool's fresh servers; the pool itself replaces dead servers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from codemill import metrics
from codemill.models.engines import RolloutEngine, RolloutParams, derive_seed
from codemill.problems.problem import ExecProblem
from codemill.problems.rewards import Reward, score
from codemill.rl.env import Environment, Episode, StepResult, Task
from codemill.rl.trajectory import trajectory_row
from codemill.sandbox.judge_pool import JudgePool

RETRY_KINDS = ("no_verdict", "judge_error")  # the host got no verdict from the judge: judge again


def prompt_seed(seed: int, group: int) -> int:
    """The seed of a group's prompt: fixed by the iteration seed and the group alone."""
    return derive_seed("rollout", seed, group)


@dataclass
class RolloutTimings:
    """Where a collection's time went. ``generation_s`` and ``reward_s`` are summed over batches (and over workers
    on Ray), so with overlap their sum can exceed ``wall_s``."""

    generation_s: float = 0.0
    reward_s: float = 0.0
    reward_wait_s: float = 0.0  # time generation stood still waiting for the judge (the part not overlapped)
    wall_s: float = 0.0
    overlap: bool = True
    samples: int = 0
    tokens: int = 0  # completion tokens generated
    batches: int = 0
    rejudged: int = 0  # samples judged again after the host got no verdict
    workers: int = 1
    suspicious: dict[str, int] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_s": self.samples_per_s, "tokens_per_s": self.tokens_per_s}

    def add(self, other: RolloutTimings) -> None:
        """Fold a worker's timings into these (the wall time is the caller's own)."""
        self.generation_s += other.generation_s
        self.reward_s += other.reward_s
        self.reward_wait_s += other.reward_wait_s
        self.samples += other.samples
        self.tokens += other.tokens
        self.batches += other.batches
        self.rejudged += other.rejudged
        for k, v in other.suspicious.items():
            self.suspicious[k] = self.suspicious.get(k, 0) + v


def batches_of(groups: Sequence[int], batch_problems: int) -> list[list[int]]:
    """Positions in ``groups`` cut into the fixed batches ``group // batch_problems`` (groups ascending)."""
    if batch_problems < 1:
        raise ValueError(f"batch_problems must be >= 1, got {batch_problems}")
    if any(b <= a for a, b in zip(groups, groups[1:], strict=False)):
        raise ValueError("groups must be strictly increasing")
    out: dict[int, list[int]] = {}
    for pos, g in enumerate(groups):
        out.setdefault(g // batch_problems, []).append(pos)
    return list(out.values())


TaskT = TypeVar("TaskT", bound=Task)


def problem_map(problems: Iterable[TaskT]) -> dict[str, TaskT]:
    """Problems by id; the same id twice with different content is an error (rewards look problems up by id)."""
    out: dict[str, TaskT] = {}
    for p in problems:
        if p.problem_id in out and out[p.problem_id] != p:
            raise ValueError(f"two different problems share the id {p.problem_id!r}")
        out[p.problem_id] = p
    return out


def judge_counted(problems: Sequence[ExecProblem], completions: Sequence[str], pool: JudgePool,
                  retries: int = 2) -> tuple[list[Reward], list[int]]:
    """Rewards in input order, each sample with no verdict judged again up to ``retries`` times; also how many
    times each was judged again."""
    by_id = problem_map(problems)
    samples = [(p.problem_id, c) for p, c in zip(problems, completions, strict=True)]
    rewards = list(score(by_id, samples, pool).rewards)
    rejudged = [0] * len(rewards)
    for _ in range(retries):
        again = [i for i, r in enumerate(rewards) if not r.passed and r.suspicious in RETRY_KINDS]
        if not again:
            break
        for i, r in zip(again, score(by_id, [samples[i] for i in again], pool).rewards, strict=True):
            rejudged[i] += 1
            rewards[i] = Reward(r.problem_id, rewards[i].sample_idx, r.passed, r.partial, r.outcome, r.error,
                                r.duration_s, r.suspicious)
    return rewards, rejudged


def judge(problems: Sequence[ExecProblem], completions: Sequence[str], pool: JudgePool,
          retries: int = 2) -> tuple[list[Reward], int]:
    """``judge_counted`` with the repeated judgings summed."""
    rewards, rejudged = judge_counted(problems, completions, pool, retries)
    return rewards, sum(rejudged)


@dataclass
class _Batch:
    """One batch's episodes while they run; ``turn`` is the turn being stepped."""

    index: int
    episodes: list[Episode]
    turn: int = 0
    step: Future[list[StepResult]] | None = None
    stepping: list[Episode] = field(default_factory=list)
    turn_gen: Future[None] | None = None  # the turn being generated

    @property
    def live(self) -> list[Episode]:
        return [e for e in self.episodes if not e.done]


def turn_seed(episode_seed: int, turn: int) -> int:
    """The seed of an episode's turn after the first (the first is sampled with its group's k samples)."""
    return derive_seed("turn", episode_seed, turn)


def collect_rollouts(engine: RolloutEngine, env: Environment, problems: Sequence[Task], k: int,
                     params: RolloutParams, seed: int, *, batch_problems: int = 8, overlap: bool = True,
                     groups: Sequence[int] | None = None, generators: int = 1,
                     on_batch: Callable[[int, int], None] | None = None) -> tuple[list[dict[str, Any]], RolloutTimings]:
    """``k`` episodes per problem in ``env``: trajectory rows sorted by (group, sample), and timings.

    ``groups`` are the problems' indices in the iteration (default 0..n-1); a worker given a shard of whole batches
    passes their global indices, so its rows are the ones the single-process run makes. ``generators``: batches
    generated at once, each on its own thread (an engine that is safe to call from several threads: HFEngine;
    on CPU, one torch thread each, so they run on separate cores); 1 without ``overlap``. At most one more batch
    than that is in flight (being stepped); more would only queue steps while an episode's wall clock runs."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if generators < 1:
        raise ValueError(f"generators must be >= 1, got {generators}")
    groups = list(range(len(problems))) if groups is None else list(groups)
    if len(groups) != len(problems):
        raise ValueError(f"{len(problems)} problems but {len(groups)} groups")
    problem_map(problems)
    timings = RolloutTimings(overlap=overlap)
    m = metrics.get()
    lock = threading.Lock()
    t_start = time.monotonic()
    batches = batches_of(groups, batch_problems)
    limits = env.limits
    budget = min(engine.max_context, limits.max_total_tokens or engine.max_context)
    rows: list[dict[str, Any]] = []
    finished = 0

    def generate(batch: _Batch) -> None:
        """The batch's next turn for its live episodes, then its step submitted."""
        t0 = time.monotonic()
        if batch.turn == 0:
            firsts = batch.episodes[::k]
            generated = engine.generate_ids([e.prompt_ids for e in firsts], k, params,
                                            [prompt_seed(seed, e.group) for e in firsts])
            if any(len(cs) != k for cs in generated):
                raise RuntimeError(f"the engine returned {[len(cs) for cs in generated]} samples, not {k} per prompt")
            actions = [c for cs in generated for c in cs]
            live = batch.episodes
        else:
            live = batch.live
            generated = engine.generate_ids([e.context for e in live], 1, params,
                                            [turn_seed(e.seed, batch.turn) for e in live])
            actions = [cs[0] for cs in generated]
        spent = time.monotonic() - t0
        tokens = sum(len(c.completion_ids) for c in actions)
        with lock:
            timings.generation_s += spent
            timings.tokens += tokens
            if batch.turn == 0:
                timings.samples += len(actions)
        if batch.turn == 0:
            m.rollout_samples.inc(len(actions))
        m.rollout_generation_seconds.inc(spent)
        m.rollout_tokens.inc(tokens)
        for e, a in zip(live, actions, strict=True):
            e.act(a)
        last = [batch.turn + 1 >= limits.max_turns] * len(live)
        batch.stepping = live
        batch.step = stepper.submit(step, live, actions, last)

    def step(live: list[Episode], actions: list[Any], last: list[bool]) -> list[StepResult]:
        t0 = time.monotonic()
        results = env.step(live, actions, last)
        if len(results) != len(live):
            raise RuntimeError(f"the environment answered {len(results)} of {len(live)} episodes")
        spent = time.monotonic() - t0
        m.rollout_reward_seconds.inc(spent)
        with lock:
            timings.reward_s += spent
            timings.rejudged += sum(r.info.rejudged for r in results)
        return results

    def settle(batch: _Batch) -> bool:
        """Apply the batch's step; True when every episode of the batch has ended (its rows are then taken)."""
        assert batch.step is not None
        results = batch.step.result()
        now = time.monotonic()
        final_turn = batch.turn + 1 >= limits.max_turns
        for e, r in zip(batch.stepping, results, strict=True):
            if final_turn and not r.done:
                r = StepResult([], r.reward, True, r.info)  # the loop's turn limit ends what the env did not
            e.observe(r)
            if e.done:
                continue
            if len(e.context) + params.max_new_tokens > budget:
                e.cut("max_tokens")
            elif limits.wall_s is not None and now - e.started > limits.wall_s:
                e.cut("wall_time")
        batch.step, batch.stepping, batch.turn = None, [], batch.turn + 1
        if batch.live:
            return False
        m.rollout_samples_in_flight.dec(len(batch.episodes))
        for e in batch.episodes:
            m.rollout_episodes.labels(e.info.outcome if e.info else e.finish_reason).inc()
            if e.info and e.info.suspicious:
                timings.suspicious[e.info.suspicious] = timings.suspicious.get(e.info.suspicious, 0) + 1
            rows.append(trajectory_row(e))
        return True

    def start(b: int) -> _Batch:
        episodes = []
        now = time.monotonic()
        for pos in batches[b]:
            problem, group = problems[pos], groups[pos]
            pseed = prompt_seed(seed, group)
            reset = env.reset(problem, pseed)
            episodes += [Episode.start(problem, group, j, derive_seed("episode", pseed, j), reset, now)
                         for j in range(k)]
        batch = _Batch(b, episodes)
        m.rollout_samples_in_flight.inc(len(episodes))  # here, so a failure takes off exactly what was put on
        batch.turn_gen = gen_pool.submit(generate, batch)
        return batch

    if not overlap:  # one turn at a time, stepped before anything else is generated
        generators = 1
    in_flight = generators + 1 if overlap else 1
    running: list[_Batch] = []
    next_batch = 0
    stepper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="codemill-rewards")
    gen_pool = ThreadPoolExecutor(max_workers=generators, thread_name_prefix="codemill-generate")
    try:
        while next_batch < len(batches) or running:
            for b in running:
                if b.turn_gen is not None and b.turn_gen.done():
                    b.turn_gen.result()  # a failed generation raises here; a done one has submitted its step
                    b.turn_gen = None
            generating = sum(b.turn_gen is not None for b in running)
            ready = [b for b in running if b.turn_gen is None and b.step is not None and b.step.done()]
            if ready:
                batch = ready[0]
                if settle(batch):
                    running.remove(batch)
                    finished += 1
                    if on_batch:
                        on_batch(finished, len(batches))
                else:
                    batch.turn_gen = gen_pool.submit(generate, batch)
            elif next_batch < len(batches) and generating < generators and len(running) < in_flight:
                running.append(start(next_batch))
                next_batch += 1
            else:
                t0 = time.monotonic()
                pending: list[Future[Any]] = [f for b in running for f in (b.turn_gen, b.step) if f is not None]
                wait(pending, return_when=FIRST_COMPLETED)
                if not generating:
                    timings.reward_wait_s += time.monotonic() - t0
    except BaseException:
        m.rollout_samples_in_flight.dec(sum(len(b.episodes) for b in running))
        raise
    finally:  # a failure does not wait for the queued work
        gen_pool.shutdown(wait=True, cancel_futures=True)
        stepper.shutdown(wait=True, cancel_futures=True)
    timings.batches = len(batches)
    timings.wall_s = time.monotonic() - t_start
    rows.sort(key=lambda r: (r["group"], r["sample"]))
    return rows, timings
