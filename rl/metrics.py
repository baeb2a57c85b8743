"""What an RL iteration logs: reward and pass-rate statistics of its rollouts, and the update's own numbers.

The names follow what verl, TRL and OpenRLHF log per step: reward mean/std, the share of groups whose rewards
are all equal (they carry no GRPO signal), response length (sampled tokens) and truncated share, turns per
episode and the share of tokens after the prompt that the environment wrote (loss mask 0), suspicious samples
(a candidate that exited, was killed, or sent bad data: what a policy learning its grader's holes looks like),
and timings with throughput.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from codemill.rl.trajectory import TRUNCATED_REASONS

SUMMARY_KEYS = ("samples", "problems", "reward_mean", "reward_std", "pass_rate", "zero_variance_groups",
                "response_tokens_mean", "truncated_frac", "turns_mean", "observed_token_frac", "suspicious")


def rollout_metrics(rows: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """Statistics of one rollouts table (rows per the rollouts contract)."""
    if not rows:
        raise ValueError("no rollouts to describe")
    rewards = np.array([r["reward"] for r in rows], dtype=np.float64)
    groups: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        groups[r["group"]].append(float(r["reward"]))
    lengths = np.array([sum(r["loss_mask"]) for r in rows], dtype=np.float64)  # sampled tokens
    after_prompt = sum(len(r["loss_mask"]) for r in rows)
    suspicious = Counter(r["suspicious"] for r in rows if r["suspicious"])
    return {
        "samples": len(rows), "problems": len(groups), "group_size": k,
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
        "pass_rate": float(np.mean([r["outcome"] == "passed" for r in rows])),
        "zero_variance_groups": float(np.mean([len(set(g)) == 1 for g in groups.values()])),
        "response_tokens_mean": float(lengths.mean()), "response_tokens_max": int(lengths.max()),
        "truncated_frac": float(np.mean([r["finish_reason"] in TRUNCATED_REASONS for r in rows])),
        "turns_mean": float(np.mean([r["turns"] for r in rows])),
        "observed_token_frac": float(1.0 - lengths.sum() / after_prompt) if after_prompt else 0.0,
        "suspicious": int(sum(suspicious.values())), "suspicious_by_kind": dict(suspicious),
        "outcomes": dict(Counter(r["outcome"] for r in rows)),
    }


def scalar_metrics(stats: dict[str, Any]) -> dict[str, float]:
    """The numbers of a rollouts manifest as flat MLflow metrics (timings as ``time.<name>``)."""
    out = {k: float(v) for k, v in stats.items()
           if isinstance(v, int | float) and not isinstance(v, bool) and k not in ("seed",)}
    out |= {f"time.{k}": float(v) for k, v in stats.get("timings", {}).items()
            if isinstance(v, int | float) and not isinstance(v, bool)}
    return out


def update_metrics(stats: dict[str, Any]) -> dict[str, float]:
    """The numbers of a policy manifest: the GRPO update's (kl, entropy, clip fractions, ...) or the fine-tune's."""
    nested = stats.get("update") or {}
    flat = {**{k: v for k, v in stats.items() if k != "update"}, **nested}
    return {k: float(v) for k, v in flat.items() if isinstance(v, int | float) and not isinstance(v, bool)}
