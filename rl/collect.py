"""One RL iteration's rollouts from its config: the engine ``rl.rollout.engine`` names (a vLLM engine lives
across iterations in this process and gets each new policy's weights: ``models.engines.rollout_engine``), the judge
pool with the rollout's sandbox limits, the environment ``rl.env`` names, and the rollout loop; or the same on
Ray workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from codemill.models.engines import RolloutParams, engine_info, rollout_engine
from codemill.rl.config import RLConfig, RolloutConfig
from codemill.rl.env import Task
from codemill.rl.envs import env_for, opened
from codemill.rl.rollout import collect_rollouts
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool


def rollout_params(r: RolloutConfig) -> RolloutParams:
    return RolloutParams(temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                         stop=tuple(r.stop))


def collect_iteration(cfg: RLConfig, problems: Sequence[Task], policy_hf: str, seed: int, k: int, *,
                      device: str = "cpu", ray_address: str | None = None,
                      say: Callable[[str], None] = lambda msg: None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """k episodes per problem in ``cfg.env`` (rows sorted by group, sample) and the timings (with ``engine``: what
    sampled them), in this process (the engine ``rl.rollout.engine`` names, the judge pool, the environment) or
    on Ray (HFEngine workers, each with its own pool)."""
    r = cfg.rollout
    params, limits = rollout_params(r), Limits.of(r)
    if ray_address:
        from codemill.rl.rollout_ray import collect_rollouts_ray

        if r.engine != "hf":
            raise ValueError(f"rl.rollout.engine {r.engine!r} does not run on Ray (its workers use HFEngine)")
        rows, timings = collect_rollouts_ray(ray_address, policy_hf, problems, k, params, limits, seed,
                                             batch_problems=r.batch_problems, overlap=r.overlap,
                                             max_context=r.context_len, device=device, workers=r.workers,
                                             env_config=cfg.env, reward=r.reward)
        return rows, {**timings.as_dict(), "weight_sync_s": 0.0, "engine": "hf"}
    with rollout_engine(r, policy_hf, device) as (engine, weight_sync_s):
        generators = generation_threads(r, device)
        with JudgePool(limits, workers=r.workers) as pool, _one_torch_thread_per_batch(device), \
                opened(env_for(cfg.env, engine, pool, r.max_new_tokens, reward=r.reward)) as env:
            rows, timings = collect_rollouts(engine, env, problems, k, params, seed,
                                             batch_problems=r.batch_problems, overlap=r.overlap,
                                             generators=generators, on_batch=lambda i, n: say(f"batch {i}/{n}"))
    info = engine_info(engine)
    return rows, {**timings.as_dict(), "weight_sync_s": weight_sync_s, "engine": info["engine"],
                  "engine_version": info["version"]}


def generation_threads(r: RolloutConfig, device: str) -> int:
    """Batches HFEngine generates at once on CPU (``rl.rollout.threads``; empty: one per usable core; the rollout
    loop takes one without ``overlap``). One elsewhere: a GPU runs one batch at a time, and vLLM batches on its
    own (Ray workers generate one batch each)."""
    from codemill.cpus import usable_cpus

    if device != "cpu" or r.engine != "hf":
        return 1
    return r.threads or usable_cpus()


@contextmanager
def _one_torch_thread_per_batch(device: str) -> Iterator[None]:
    """On CPU each batch generates on one torch thread, so its arithmetic (and its tokens) is the same whatever
    ``rl.rollout.threads`` is, and the batches generating at once run on separate cores. torch's own threads
    would spin while they wait, and spinning threads that share their cores with other work (the sandboxes,
    another job on the machine) made sampling several times slower."""
    import torch

    before = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


