"""Rollouts fanned out to Ray workers (a local cluster) equal the single-process rollouts for a fixed seed, also
when a worker dies mid-collection (Ray restarts it and retries its shard) and after a weight sync."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from codemill.evals.engines import HFEngine, RolloutParams
from codemill.evals.rollout import collect_rollouts
from codemill.evals.sandbox import Limits
from codemill.evals.sandbox.judge_pool import JudgePool
from codemill.evals.synthetic import synthetic_problems
from tests.tiny_policy import make_policy, torch_threads

LIMITS = Limits(wall_s=3.0, cpu_s=2, memory_bytes=256 << 20)
PARAMS = RolloutParams(temperature=1.0, max_new_tokens=16, stop=("\ndef",))
RAY_INIT = {"num_cpus": 2, "object_store_memory": 100 * 2**20, "include_dashboard": False}


def _problems():
    problems = synthetic_problems(9, 5)
    problems[2] = synthetic_problems(5, 1)[0]  # its reference is the answer below: some rewards are not 0
    return problems


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def policies(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("policies")
    return make_policy(root / "a"), make_policy(root / "b", seed=3)


def _local(policy: Path, seed: int) -> list[dict]:
    with JudgePool(LIMITS, workers=1) as pool:
        rows, _ = collect_rollouts(HFEngine(policy), _problems(), 2, PARAMS, pool, seed=seed, batch_problems=2)
    return rows


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) == 10
    for x, y in zip(a, b, strict=True):  # text, token ids, log-probs, rewards: everything but the judge's timing
        assert {k: v for k, v in x.items() if k != "duration_s"} == {k: v for k, v in y.items() if k != "duration_s"}


def test_ray_workers_give_the_single_process_rollouts(policies):
    import ray

    from codemill.evals.rollout_ray import RayRollouts

    first, second = policies
    with RayRollouts(first, ray_address="local", workers=2, limits=LIMITS, judge_workers=1, ray_init=RAY_INIT,
                     max_restarts=1) as fleet:
        pids = ray.get([a.pid.remote() for a in fleet.actors])
        assert len(set(pids)) == 2  # two worker processes
        rows, timings = fleet.collect(_problems(), 2, PARAMS, seed=4, batch_problems=2)
        _same(_local(first, 4), rows)
        assert timings.workers == 2 and timings.batches == 3 and timings.samples == 10
        assert timings.generation_s > 0 and timings.reward_s > 0

        # A worker killed while it works is restarted by Ray, reloads the current policy and redoes its shard.
        fleet.load_weights(second)
        killer = threading.Timer(1.0, os.kill, (pids[0], signal.SIGKILL))  # the worker process this cluster started
        killer.start()
        t0 = time.monotonic()
        rows, _ = fleet.collect(_problems(), 2, PARAMS, seed=5, batch_problems=2)
        killer.join()
        assert time.monotonic() - t0 > 1.0  # the kill landed during the collection
        assert ray.get(fleet.actors[0].pid.remote()) != pids[0]  # a fresh process
        _same(_local(second, 5), rows)
    assert not ray.is_initialized()
