"""What an RL iteration logs: reward and pass-rate statistics of its rollouts, and the update's own numbers.

The names follow what verl, TRL and OpenRLHF log per step: reward mean/std, the share of groups whose rewards
are all equal (they carry no GRPO signal), response length (sampled tokens) and truncated share, turns per
episode and the share of tokens after the prompt that the environment wrote (loss mask 0), suspicious samples
(a candidate that exited, was killed, or sent bad data: what a policy learning its grader's holes looks like),
tokens per episode, the share of episodes that ended on a limit, and timings with throughput. Rows whose
environment keeps its own numbers (``env_stats``: a repository agent's tool calls and errors by tool) add their
totals and per-episode means.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from codemill.rl.env import CUT_REASONS
from codemill.rl.trajectory import TRUNCATED_REASONS

SUMMARY_KEYS = ("samples", "problems", "reward_mean", "reward_std", "pass_rate", "zero_variance_groups",
                "response_tokens_mean", "truncated_frac", "turns_mean", "observed_token_frac", "suspicious",
                "tokens_per_episode_mean", "limits_hit_frac", "tool_calls_mean", "tool_errors_mean")
METRIC_UNSAFE = re.compile(r"[^\w./ -]")  # what MLflow refuses in a metric name
COUNTED = ("tool_calls", "tool_errors", "finish_reasons")  # counts by name, logged as <key>.<name>


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
        "tokens_per_episode_mean": float(np.mean([len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows])),
        "limits_hit_frac": float(np.mean([r["finish_reason"] in CUT_REASONS for r in rows])),
        "finish_reasons": dict(Counter(r["finish_reason"] for r in rows)),
    } | tool_metrics(rows)


def tool_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Tool calls and tool errors by tool (totals) and per episode (means), from the rows' ``env_stats``; nothing
    when no row holds tool calls."""
    stats = [json.loads(r.get("env_stats") or "{}") for r in rows]
    if not any("tool_calls" in s for s in stats):
        return {}
    calls: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for s in stats:
        calls.update(s.get("tool_calls", {}))
        errors.update(s.get("tool_errors", {}))
    return {"tool_calls": dict(calls), "tool_errors": dict(errors), "tool_calls_mean": sum(calls.values()) / len(rows),
            "tool_errors_mean": sum(errors.values()) / len(rows)}


def scalar_metrics(stats: dict[str, Any]) -> dict[str, float]:
    """The numbers of a rollouts manifest as flat MLflow metrics (timings as ``time.<name>``)."""
    out = {k: float(v) for k, v in stats.items()
           if isinstance(v, int | float) and not isinstance(v, bool) and k not in ("seed",)}
    out |= {f"time.{k}": float(v) for k, v in stats.get("timings", {}).items()
            if isinstance(v, int | float) and not isinstance(v, bool)}
    return out | counted_metrics(stats)


def counted_metrics(stats: dict[str, Any]) -> dict[str, float]:
    """The counts by name (``COUNTED``) as ``<key>.<name>`` metrics, each name made one MLflow accepts."""
    return {f"{key}.{METRIC_UNSAFE.sub('_', name)}": float(v) for key in COUNTED
            for name, v in sorted((stats.get(key) or {}).items())}


def update_metrics(stats: dict[str, Any]) -> dict[str, float]:
    """The numbers of a policy manifest: the GRPO update's (kl, entropy, clip fractions, ...) or the fine-tune's."""
    nested = stats.get("update") or {}
    flat = {**{k: v for k, v in stats.items() if k != "update"}, **nested}
    return {k: float(v) for k, v in flat.items() if isinstance(v, int | float) and not isinstance(v, bool)}
