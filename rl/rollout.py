"""Rollouts for RL: k samples per problem from a ``RolloutEngine``, rewarded in the sandbox while the next batch
generates, written as the contract's ``rollouts.parquet`` table.

``collect_rollouts`` walks the problems in fixed batches (``batch_problems`` consecutive groups; a problem's
group is its index in the iteration). Each finished batch goes to ``sandbox.rewards.score`` on the ``JudgePool`` in
a background thread, so judging batch i overlaps generating batch i+1 (``overlap=False`` judges each batch
before generating the next: the benchmark's reference). A prompt's seed is ``derive_seed(seed, group)``, so the
samples do not depend on the batching, the order or the worker (``rollout_ray`` shards whole batches over Ray).

Rewards fail closed: a sandbox that cannot start raises (``SandboxUnavailable``), never zero rewards. A sample the
host could not get a verdict for (the judge server lost mid-sample: kinds ``no_verdict`` / ``judge_error``; the
candidate cannot reach the judge's process, so these are the grader's failures, not the sample's) is judged
again, up to ``reward_retries`` times, on the pool's fresh servers; the pool itself replaces dead servers.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from codemill import metrics
from codemill.problems.problem import ExecProblem
from codemill.rl.engines import FINISH_REASONS, Completion, RolloutEngine, RolloutParams, derive_seed
from codemill.sandbox.judge_pool import JudgePool
from codemill.sandbox.rewards import Reward, score

ROLLOUTS_FILE = "rollouts.parquet"
RETRY_KINDS = ("no_verdict", "judge_error")  # the host got no verdict from the judge: judge again

ROLLOUT_SCHEMA = pa.schema([
    ("problem_id", pa.string()),
    ("group", pa.int32()),
    ("sample", pa.int32()),
    ("prompt", pa.string()),
    ("completion", pa.string()),
    ("prompt_ids", pa.list_(pa.int32())),
    ("completion_ids", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("finish_reason", pa.string()),
    ("reward", pa.float64()),
    ("partial", pa.float64()),
    ("outcome", pa.string()),
    ("duration_s", pa.float64()),
    ("suspicious", pa.string()),
])


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


def problem_map(problems: Iterable[ExecProblem]) -> dict[str, ExecProblem]:
    """Problems by id; the same id twice with different content is an error (rewards look problems up by id)."""
    out: dict[str, ExecProblem] = {}
    for p in problems:
        if p.problem_id in out and out[p.problem_id] != p:
            raise ValueError(f"two different problems share the id {p.problem_id!r}")
        out[p.problem_id] = p
    return out


def judge(problems: Sequence[ExecProblem], completions: Sequence[str], pool: JudgePool,
          retries: int = 2) -> tuple[list[Reward], int]:
    """Rewards in input order, each sample with no verdict judged again up to ``retries`` times; also how many
    judgings were repeated."""
    by_id = problem_map(problems)
    samples = [(p.problem_id, c) for p, c in zip(problems, completions, strict=True)]
    rewards = list(score(by_id, samples, pool).rewards)
    rejudged = 0
    for _ in range(retries):
        again = [i for i, r in enumerate(rewards) if not r.passed and r.suspicious in RETRY_KINDS]
        if not again:
            break
        rejudged += len(again)
        for i, r in zip(again, score(by_id, [samples[i] for i in again], pool).rewards, strict=True):
            rewards[i] = Reward(r.problem_id, rewards[i].sample_idx, r.passed, r.partial, r.outcome, r.error,
                                r.duration_s, r.suspicious)
    return rewards, rejudged


def _rows(problems: Sequence[ExecProblem], groups: Sequence[int], generated: Sequence[Sequence[Completion]],
          rewards: Sequence[Reward]) -> list[dict[str, Any]]:
    rows = []
    flat = [(p, g, j, c) for p, g, cs in zip(problems, groups, generated, strict=True) for j, c in enumerate(cs)]
    for (p, g, j, c), r in zip(flat, rewards, strict=True):
        rows.append({"problem_id": p.problem_id, "group": g, "sample": j, "prompt": p.prompt,
                     "completion": c.text, "prompt_ids": c.prompt_ids, "completion_ids": c.completion_ids,
                     "logprobs": c.logprobs, "finish_reason": c.finish_reason, "reward": r.reward,
                     "partial": r.partial, "outcome": r.outcome, "duration_s": r.duration_s,
                     "suspicious": r.suspicious or ""})
    return rows


def collect_rollouts(engine: RolloutEngine, problems: Sequence[ExecProblem], k: int, params: RolloutParams,
                     pool: JudgePool, seed: int, *, batch_problems: int = 8, overlap: bool = True,
                     groups: Sequence[int] | None = None, reward_retries: int = 2,
                     on_batch: Callable[[int, int], None] | None = None) -> tuple[list[dict[str, Any]], RolloutTimings]:
    """``k`` rewarded samples per problem: rows per the rollouts table, sorted by (group, sample), and timings.

    ``groups`` are the problems' indices in the iteration (default 0..n-1); a worker given a shard of whole batches
    passes their global indices, so its rows are the ones the single-process run makes."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    groups = list(range(len(problems))) if groups is None else list(groups)
    if len(groups) != len(problems):
        raise ValueError(f"{len(problems)} problems but {len(groups)} groups")
    problem_map(problems)
    timings = RolloutTimings(overlap=overlap)
    m = metrics.get()
    lock = threading.Lock()
    t_start = time.monotonic()
    batches = batches_of(groups, batch_problems)

    def reward_batch(positions: list[int], generated: list[list[Completion]]) -> list[dict[str, Any]]:
        t0 = time.monotonic()
        batch_problems_ = [problems[i] for i in positions]
        flat_p = [p for p, cs in zip(batch_problems_, generated, strict=True) for _ in cs]
        rewards, rejudged = judge(flat_p, [c.text for cs in generated for c in cs], pool, reward_retries)
        spent = time.monotonic() - t0
        m.rollout_samples_in_flight.dec(len(rewards))
        m.rollout_reward_seconds.inc(spent)
        for r in rewards:
            m.rollout_episodes.labels(r.outcome).inc()
        with lock:
            timings.reward_s += spent
            timings.rejudged += rejudged
            for r in rewards:
                if r.suspicious:
                    timings.suspicious[r.suspicious] = timings.suspicious.get(r.suspicious, 0) + 1
        return _rows(batch_problems_, [groups[i] for i in positions], generated, rewards)

    pending: list[Future[list[dict[str, Any]]]] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="codemill-rewards") as rewarder:
        for b, positions in enumerate(batches):
            t0 = time.monotonic()
            generated = engine.generate([problems[i].prompt for i in positions], k, params,
                                        [prompt_seed(seed, groups[i]) for i in positions])
            spent = time.monotonic() - t0
            tokens = sum(len(c.completion_ids) for cs in generated for c in cs)
            samples = sum(len(cs) for cs in generated)
            timings.generation_s += spent
            timings.tokens += tokens
            timings.samples += samples
            m.rollout_generation_seconds.inc(spent)
            m.rollout_tokens.inc(tokens)
            m.rollout_samples.inc(samples)
            m.rollout_samples_in_flight.inc(samples)
            if any(len(cs) != k for cs in generated):
                raise RuntimeError(f"the engine returned {[len(cs) for cs in generated]} samples, not {k} per prompt")
            future = rewarder.submit(reward_batch, positions, generated)
            if not overlap:
                t0 = time.monotonic()
                future.result()  # judge this batch before generating the next
                timings.reward_wait_s += time.monotonic() - t0
            pending.append(future)
            for f in pending:  # a judge that failed (the sandbox gone) stops the generation now, not at the end
                if f.done() and f.exception() is not None:
                    f.result()
            if on_batch:
                on_batch(b + 1, len(batches))
        t0 = time.monotonic()
        rows = [row for f in pending for row in f.result()]
        timings.reward_wait_s += time.monotonic() - t0
    timings.batches = len(batches)
    timings.wall_s = time.monotonic() - t_start
    rows.sort(key=lambda r: (r["group"], r["sample"]))
    return rows, timings


class RolloutsSchemaError(ValueError):
    """A rollouts table that is not the contract's; the message lists every problem found."""


def rollouts_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows as a table with the exact schema (columns in order, types as the contract names them)."""
    table = pa.Table.from_pylist(list(rows), schema=ROLLOUT_SCHEMA)
    problems = _check(table)
    if problems:
        raise RolloutsSchemaError("rollouts rows: " + "; ".join(problems))
    return table


def write_rollouts(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write ``rollouts.parquet`` (checked first; written to a temporary name and renamed, so a reader never sees
    half a file). ``path`` is the file, or a folder to write ``rollouts.parquet`` into."""
    path = Path(path)
    if path.is_dir():
        path = path / ROLLOUTS_FILE
    table = rollouts_table(rows)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def read_rollouts(path: str | Path) -> pa.Table:
    """A rollouts file, validated: the exact columns and types, sorted (group, sample), one log-prob per completion
    token, known finish reasons. Raises ``RolloutsSchemaError`` naming everything that is wrong."""
    path = Path(path)
    if path.is_dir():
        path = path / ROLLOUTS_FILE
    table = pq.read_table(path)
    problems = _check(table)
    if problems:
        raise RolloutsSchemaError(f"{path}: " + "; ".join(problems))
    return table


def _check(table: pa.Table) -> list[str]:
    problems = []
    want = {f.name: f.type for f in ROLLOUT_SCHEMA}
    have = {f.name: f.type for f in table.schema}
    missing = [n for n in want if n not in have]
    extra = [n for n in have if n not in want]
    if missing:
        problems.append(f"missing columns {missing}")
    if extra:
        problems.append(f"unexpected columns {extra}")
    problems += [f"column {n!r} is {have[n]}, expected {t}" for n, t in want.items() if n in have and have[n] != t]
    if problems:
        return problems
    if table.schema.names != ROLLOUT_SCHEMA.names:
        problems.append(f"columns out of order: {table.schema.names}")
    nulls = [n for n in want if table.column(n).null_count]
    if nulls:
        problems.append(f"null values in {nulls}")
    cols = table.select(["group", "sample", "completion_ids", "logprobs", "finish_reason"]).to_pydict()
    keys = list(zip(cols["group"], cols["sample"], strict=True))
    if any(b <= a for a, b in zip(keys, keys[1:], strict=False)):
        problems.append("rows are not sorted by (group, sample) without duplicates")
    bad_len = [i for i, (ids, lps) in enumerate(zip(cols["completion_ids"], cols["logprobs"], strict=True))
               if ids is not None and lps is not None and len(ids) != len(lps)]
    if bad_len:
        problems.append(f"rows {bad_len[:5]} have a different number of log-probs than completion tokens")
    reasons = sorted({r for r in cols["finish_reason"] if r not in FINISH_REASONS}, key=str)
    if reasons:
        problems.append(f"unknown finish_reason values {reasons[:5]} (expected one of {list(FINISH_REASONS)})")
    return problems
