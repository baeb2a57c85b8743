"""What an RL iteration logs from its rollouts: the agent numbers an environment keeps per episode, added up, and
names MLflow accepts."""

import json

from codemill.rl.metrics import rollout_metrics, scalar_metrics


def _row(group: int, sample: int, finish: str, reward: float, stats: dict | None = None) -> dict:
    return {"problem_id": f"t{group}", "group": group, "sample": sample, "reward": reward,
            "outcome": "passed" if reward else "unresolved", "loss_mask": [1, 1, 0, 0, 1], "prompt_ids": [1, 2, 3],
            "completion_ids": [4, 5, 6, 7, 8], "finish_reason": finish, "turns": 2, "suspicious": "",
            "env_stats": json.dumps(stats) if stats is not None else "{}"}


def test_tool_calls_errors_tokens_and_limits_add_up_over_episodes():
    rows = [_row(0, 0, "stop", 1.0, {"tool_calls": {"edit": 2, "read_file": 1}, "tool_errors": {"edit": 1}}),
            _row(0, 1, "max_turns", 0.0, {"tool_calls": {"(malformed)": 1}, "tool_errors": {"(malformed)": 1}})]
    m = rollout_metrics(rows, 2)
    assert m["tool_calls"] == {"edit": 2, "read_file": 1, "(malformed)": 1} and m["tool_calls_mean"] == 2.0
    assert m["tool_errors_mean"] == 1.0 and m["limits_hit_frac"] == 0.5 and m["tokens_per_episode_mean"] == 8.0
    assert m["finish_reasons"] == {"stop": 1, "max_turns": 1} and m["pass_rate"] == 0.5
    flat = scalar_metrics(m)
    assert flat["tool_calls.edit"] == 2.0 and flat["tool_errors._malformed_"] == 1.0
    assert flat["finish_reasons.max_turns"] == 1.0 and "suspicious_by_kind" not in flat


def test_environments_without_tool_numbers_add_none():
    m = rollout_metrics([_row(0, 0, "stop", 1.0), _row(0, 1, "length", 0.0)], 2)
    assert "tool_calls" not in m and "tool_calls_mean" not in m and m["limits_hit_frac"] == 0.0
