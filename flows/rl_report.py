"""What an ``rl`` run reports: one row per iteration (rewards, tool use, the update's numbers, where the time
went), logged on the MLflow parent run with the held-out comparison and the reward curve, and shown in the
Prefect UI."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect.artifacts import create_table_artifact

from codemill.flows.artifacts import publish_png
from codemill.flows.run import FlowRun
from codemill.lineage import tags as T
from codemill.rl.metrics import counted_metrics
from codemill.tasks.common import StageResult
from codemill.tasks.resolve_model import ResolvedModel

if TYPE_CHECKING:
    from codemill.evals.heldout import PassRateComparison


ROLLOUT_COLUMNS = ("reward_mean", "reward_std", "pass_rate", "zero_variance_groups", "response_tokens_mean",
                   "truncated_frac", "turns_mean", "observed_token_frac", "suspicious", "tokens_per_episode_mean",
                   "limits_hit_frac")


def iteration_table(stages: dict[str, StageResult], iterations: int) -> list[dict[str, Any]]:
    """One row per iteration: the rollouts' reward statistics (``pass_rate``: the resolved rate of repository
    tasks), tool calls and errors by tool and ends by reason where the environment counts them, the update's
    numbers, and where the time went (``env_s``: stepping the environment, judging included, against
    ``generation_s``)."""
    rows = []
    for i in range(iterations):
        ro, up = stages[f"rollouts:{i}"].summary, stages[f"update:{i}"].summary
        t = ro.get("timings", {})
        u = up.get("update") or {}
        row: dict[str, Any] = {
               "iteration": i, **{k: ro.get(k) for k in ROLLOUT_COLUMNS},
               **{k: ro[k] for k in ("tool_calls_mean", "tool_errors_mean") if k in ro},
               **counted_metrics(ro),
               "signal_groups": None if ro.get("zero_variance_groups") is None
               else 1.0 - float(ro["zero_variance_groups"]),
               "kl": u.get("kl"), "entropy": u.get("entropy"), "clip_frac_low": u.get("clip_frac_low"),
               "clip_frac_high": u.get("clip_frac_high"), "groups_kept": u.get("groups_kept"),
               "generation_s": t.get("generation_s"), "env_s": t.get("reward_s"), "rollout_wall_s": t.get("wall_s"),
               "update_s": up.get("update_s"), "weight_sync_s": t.get("weight_sync_s"),
               "tokens_per_s": t.get("tokens_per_s"), "samples_per_s": t.get("samples_per_s")}
        rows.append(row)
    return rows


def publish_rl(run: FlowRun, algorithm: str, iterations: int, stages: dict[str, StageResult],
               final: ResolvedModel, heldout: PassRateComparison) -> list[dict[str, Any]]:
    """Per-iteration metrics, the held-out comparison, the reward curve and the stage digests on the parent
    run; the iteration table in the Prefect UI. Returns the table."""
    from codemill.report import reward_curve_png

    table = iteration_table(stages, iterations)
    lineage, parent = run.lineage, run.parent
    for row in table:
        lineage.log_metrics(parent, {f"rl.{k}": float(v) for k, v in row.items()
                                     if isinstance(v, int | float) and k != "iteration"}, step=row["iteration"])
    lineage.log_metrics(parent, {"heldout_pass_rate_before": heldout.before.rate,
                                 "heldout_pass_rate_after": heldout.after.rate, "heldout_gain": heldout.gain,
                                 "heldout_gain_ci_low": heldout.gain_ci_low,
                                 "heldout_gain_ci_high": heldout.gain_ci_high, "heldout_p_value": heldout.p_value})
    lineage.log_table(parent, table, "rl_iterations.json")
    publish_png(lineage, reward_curve_png(table, heldout), "reward_curve.png", "reward-curve",
                "RL: rollout reward and pass rate per iteration, held-out pass rate before/after", parent)
    lineage.tag(parent, {T.MODEL_ID: final.model_id, T.MODEL_DIGEST: final.ref.digest,
                         **{T.stage_digest(k): v.ref.digest for k, v in stages.items()}})
    create_table_artifact(table, key="rl-iterations", description=(
        f"RL ({algorithm}) per iteration; held-out pass rate {heldout.before.rate:.3f} -> "
        f"{heldout.after.rate:.3f} (gain {heldout.gain:+.3f}, 95% CI [{heldout.gain_ci_low:+.3f}, "
        f"{heldout.gain_ci_high:+.3f}], p={heldout.p_value:.3g}, {heldout.problems} problems)"))
    return table
