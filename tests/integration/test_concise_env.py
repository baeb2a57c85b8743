"""The ``concise`` environment in the real sandbox: the judge's verdict, minus the penalty per sampled token,
chosen from the config by its kind like every registered environment."""

from __future__ import annotations

import time

import pytest

from codemill.config import parse_config
from codemill.models.engines import Completion
from codemill.problems.synthetic import synthetic_problems
from codemill.rl.env import EnvContext, Episode
from codemill.rl.envs import build_env
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool

PROBLEMS = synthetic_problems(3, 2)
LIMITS = Limits(wall_s=3.0, cpu_s=2, memory_bytes=256 << 20)


def _episode(i: int) -> Episode:
    return Episode(PROBLEMS[i], group=i, sample=0, seed=i, prompt_ids=[], state={}, started=time.monotonic())


def _action(text: str, sampled: int) -> Completion:
    return Completion(text, [], list(range(sampled)), [0.0] * sampled, "stop")


@pytest.mark.parametrize("reward", ["binary", "partial"])
def test_the_reward_is_the_verdict_minus_the_penalty_per_sampled_token(reward):
    cfg = parse_config("rl:\n  env: {kind: concise, penalty: 0.01}\n", "test").rl.env
    right = [p.reference_solution for p in PROBLEMS]
    assert all(right)
    with JudgePool(LIMITS, workers=1) as pool:
        env = build_env(cfg, EnvContext(pool, None, 512, 64, reward))
        results = env.step([_episode(0), _episode(1), _episode(0)],
                           [_action(str(right[0]), 10), _action(str(right[1]), 30), _action("    return None\n", 5)],
                           [True, True, True])
    assert [r.done for r in results] == [True, True, True]
    assert [r.info.passed for r in results] == [True, True, False]
    assert results[0].reward == pytest.approx(1.0 - 0.10)
    assert results[1].reward == pytest.approx(1.0 - 0.30)  # the same verdict costs more when it takes longer
    assert results[2].reward == pytest.approx(results[2].info.partial * (reward == "partial") - 0.05)
