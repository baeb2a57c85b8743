"""Rollouts fanned out over Ray: each worker holds an engine for the policy and a sandbox judge pool, and runs
``collect_rollouts`` on a shard of whole batches; the rows come back in (group, sample) order.

A worker takes whole batches (batch b goes to worker b mod n) with their global group indices, so every prompt
keeps its seed and every batch its exact composition: the rows equal the single-process run's, token for token
and log-prob for log-prob (the test compares them). Each worker overlaps judging with generation exactly as the
single-process run does.

Weights: ``load_weights(hf_dir)`` makes every worker load the exported folder. Every ``collect`` also names the
current folder, so a worker that Ray restarted after it died (it comes back with the folder it was created
with) reloads the current policy before it generates. A worker process that dies mid-shard is restarted by
Ray and its shard retried (``max_restarts`` / ``max_task_retries``), so the iteration still completes.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from codemill.metrics.push import worker_pusher, worker_target
from codemill.models.engines import HFEngine, RolloutEngine, RolloutParams
from codemill.rl.env import Task
from codemill.rl.envs import env_for, opened
from codemill.rl.rollout import RolloutTimings, batches_of, collect_rollouts
from codemill.sandbox.judge_pool import JudgePool
from codemill.sandbox.limits import Limits

LOCAL = "local"
EngineFactory = Callable[[str], RolloutEngine]


def hf_engine(policy_dir: str, device: str = "cpu", max_context: int | None = None) -> RolloutEngine:
    """The default engine factory: the built-in transformers engine (``functools.partial`` it for other options)."""
    return HFEngine(policy_dir, device=device, max_context=max_context)


class RolloutWorker:
    """One Ray actor's state: an engine for the current policy folder and a judge pool (fails closed at start)."""

    def __init__(self, policy_dir: str, engine_factory: EngineFactory, limits: Limits | None, judge_workers: int,
                 torch_threads: int | None, metrics_target: dict[str, str] | None = None, index: int = 0) -> None:
        # first: the judge pool counts its slots in the registry this turns on
        self.pusher = worker_pusher(metrics_target or {}, index)
        if torch_threads:
            import torch

            torch.set_num_threads(torch_threads)
        self.engine = engine_factory(policy_dir)
        self.policy_dir = policy_dir
        self.pool = JudgePool(limits, workers=judge_workers)
        self.pool.__enter__()

    def load_weights(self, hf_dir: str) -> None:
        if hf_dir != self.policy_dir:
            self.engine.load_weights(hf_dir)
            self.policy_dir = hf_dir

    def collect(self, policy_dir: str, problems: list[Task], groups: list[int], k: int,
                params: RolloutParams, seed: int, batch_problems: int, overlap: bool, env_config: Any,
                reward: str, reward_retries: int) -> tuple[list[dict[str, Any]], RolloutTimings]:
        self.load_weights(policy_dir)
        with opened(env_for(env_config, self.engine, self.pool, params.max_new_tokens, reward=reward,
                            reward_retries=reward_retries)) as env:
            out = collect_rollouts(self.engine, env, problems, k, params, seed, batch_problems=batch_problems,
                                   overlap=overlap, groups=groups)
        if self.pusher is not None:
            self.pusher.push()  # the shard's counts, now rather than at the next interval
        return out

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.pool.close()
        if self.pusher is not None:
            self.pusher.finish()


class RayRollouts:
    """``with RayRollouts(policy_dir, ray_address="local", workers=2) as fleet: rows, t = fleet.collect(...)``.

    ``ray_address``: ``"local"`` starts a local cluster (``ray_init`` passes ``ray.init`` options such as
    ``num_cpus``); ``"auto"`` or ``"ray://host:10001"`` joins a running one. A cluster this object started is
    shut down on ``close``; one that was already initialised is left running. ``gpus_per_worker`` reserves GPUs
    for engines on CUDA (``engine_factory`` chooses the engine and its device)."""

    def __init__(self, policy_dir: str | Path, *, ray_address: str, workers: int = 2, limits: Limits | None = None,
                 judge_workers: int = 1, cpus_per_worker: float = 1, gpus_per_worker: float = 0,
                 torch_threads: int | None = None,
                 engine_factory: EngineFactory = hf_engine, ray_init: dict[str, Any] | None = None,
                 max_restarts: int = 2) -> None:
        import ray

        self._ray = ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=None if ray_address == LOCAL else ray_address, **(ray_init or {}))
        self.policy_dir = str(policy_dir)
        actor = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, max_restarts=max_restarts,
                           max_task_retries=max_restarts)(RolloutWorker)
        target = worker_target()  # the flow run's Pushgateway group, when it pushes metrics
        self.actors: list[Any] = [actor.remote(self.policy_dir, engine_factory, limits, judge_workers, torch_threads,
                                               target, i) for i in range(workers)]
        try:
            ray.get([a.pid.remote() for a in self.actors])  # every worker up (engine loaded, sandbox probed)
        except Exception:
            self.close()
            raise

    def __enter__(self) -> RayRollouts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def load_weights(self, hf_dir: str | Path) -> None:
        """Every worker loads the updated policy from its exported HF folder."""
        self.policy_dir = str(hf_dir)
        self._ray.get([a.load_weights.remote(self.policy_dir) for a in self.actors])

    def collect(self, problems: Sequence[Task], k: int, params: RolloutParams, seed: int, *,
                batch_problems: int = 8, overlap: bool = True, env_config: Any = None, reward: str = "binary",
                reward_retries: int = 2) -> tuple[list[dict[str, Any]], RolloutTimings]:
        """The rows ``collect_rollouts`` makes in one process, from the workers; timings summed over workers.
        ``env_config``: the environment (None: ``code_exec``)."""
        t0 = time.monotonic()
        groups = list(range(len(problems)))
        shards: list[list[int]] = [[] for _ in self.actors]
        for b, positions in enumerate(batches_of(groups, batch_problems)):
            shards[b % len(self.actors)].extend(positions)
        refs = [a.collect.remote(self.policy_dir, [problems[i] for i in shard], shard, k, params, seed,
                                 batch_problems, overlap, env_config, reward, reward_retries)
                for a, shard in zip(self.actors, shards, strict=True) if shard]
        timings = RolloutTimings(overlap=overlap, workers=len(refs))
        rows: list[dict[str, Any]] = []
        for shard_rows, shard_timings in self._ray.get(refs):
            rows.extend(shard_rows)
            timings.add(shard_timings)
        rows.sort(key=lambda r: (r["group"], r["sample"]))
        timings.wall_s = time.monotonic() - t0
        return rows, timings

    def close(self) -> None:
        for a in getattr(self, "actors", []):
            with contextlib.suppress(Exception):  # a dead worker has nothing left to close
                self._ray.get(a.close.remote(), timeout=30)
            self._ray.kill(a)
        self.actors = []
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()


def collect_rollouts_ray(ray_address: str, policy_dir: str | Path, problems: Sequence[Task], k: int,
                         params: RolloutParams, limits: Limits | None, seed: int, *, batch_problems: int = 8,
                         overlap: bool = True, workers: int | None = None, judge_workers: int = 1,
                         max_context: int | None = None, device: str = "cpu", env_config: Any = None,
                         reward: str = "binary", reward_retries: int = 2,
                         ray_init: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], RolloutTimings]:
    """One collection on a fleet started for it (``RayRollouts`` keeps the workers across iterations instead).
    ``workers`` Ray workers (default 2), each with ``judge_workers`` sandbox slots."""
    factory = partial(hf_engine, device=device, max_context=max_context)
    with RayRollouts(policy_dir, ray_address=ray_address, workers=workers or 2, limits=limits,
                     judge_workers=judge_workers, engine_factory=factory, ray_init=ray_init,
                     gpus_per_worker=1 if device == "cuda" else 0) as fleet:
        return fleet.collect(problems, k, params, seed, batch_problems=batch_problems, overlap=overlap,
                             env_config=env_config, reward=reward, reward_retries=reward_retries)
