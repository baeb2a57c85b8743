"""Rollouts fanned out to Ray workers (a local cluster) equal the single-process rollouts for a fixed seed, also
when a worker dies mid-collection (Ray restarts it and retries its shard) and after a weight sync."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from codemill.models.engines import HFEngine, RolloutParams
from codemill.problems.synthetic import synthetic_problems
from codemill.rl.envs import env_for
from codemill.rl.rollout import collect_rollouts
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool
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
        engine = HFEngine(policy)
        rows, _ = collect_rollouts(engine, env_for(None, engine, pool, PARAMS.max_new_tokens), _problems(), 2, PARAMS,
                                   seed=seed, batch_problems=2)
    return rows


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) == 10
    for x, y in zip(a, b, strict=True):  # text, token ids, log-probs, rewards: everything but the judge's timing
        assert {k: v for k, v in x.items() if k != "duration_s"} == {k: v for k, v in y.items() if k != "duration_s"}


def test_ray_workers_give_the_single_process_rollouts(policies):
    import ray

    from codemill.rl.rollout_ray import RayRollouts

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


@pytest.mark.system_tool("prometheus", "pushgateway")
def test_ray_workers_push_their_rollout_and_sandbox_metrics(policies, tmp_path):
    """A Ray worker does not share the flow run's registry: it pushes its own counts to the run's group with its
    index as ``worker``, and together they count every sample the run collected."""
    from codemill.metrics.push import flow_metrics
    from codemill.rl.rollout_ray import RayRollouts
    from tests.integration.monitoring import running_monitoring

    with running_monitoring(tmp_path, serve="127.0.0.1:9") as mon:
        with flow_metrics(mon.pushgateway, "rl", "ray-metrics", interval_s=60), \
                RayRollouts(policies[0], ray_address="local", workers=2, limits=LIMITS, judge_workers=1,
                            ray_init=RAY_INIT) as fleet:
            rows, _ = fleet.collect(_problems(), 2, PARAMS, seed=4, batch_problems=2)
        per_worker = {str(w): 2 * len(shard) for w, shard in enumerate(([0, 1, 4], [2, 3]))}  # batches round-robin
        run = 'flow_run="ray-metrics"'
        # three groups scraped: the flow run's own and one per worker
        mon.wait_for(f"count(codemill_rollout_samples_total{{{run}}})", lambda v: v.get("") == 3)
        by_worker = mon.values(f"sum by (worker) (codemill_rollout_samples_total{{{run}}})", by="worker")
        assert by_worker.pop("") == 0  # the driver generated nothing itself: no sample counted twice
        assert {k: int(v) for k, v in by_worker.items()} == per_worker
        verdicts = mon.values(f"sum(codemill_sandbox_verdicts_total{{{run}}})")
        assert verdicts == {"": len(rows)} and len(rows) == 10
        slots = mon.values(f"sum(codemill_sandbox_slots{{{run}}})")  # closed pools: no slot left open
        assert slots == {"": 0.0}
