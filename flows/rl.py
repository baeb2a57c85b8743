"""The ``rl`` flow: RL for code on an executable problem set, iteration by iteration, every step an artifact.

Planned first, then run: [problems] -> [warm start] -> held-out rollouts of the starting policy -> for each
iteration: rollouts (k samples per train problem, judged in the sandbox) -> policy update (GRPO or rejection
sampling) -> held-out rollouts of the final policy -> evaluation and the gate against the champion. Each step is
skipped when its artifact is in the store, so a flow killed between iterations resumes at the first missing
one, with the problems and seeds the killed run would have used.

Lineage: each policy is a LoggedModel whose training input is its rollouts; the rollouts' inputs are the
sampling policy and the problems; the problems' inputs are their sources. ``codemill lineage <model>`` walks it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.artifacts import publish_png
from codemill.flows.common import (
    close_live_vllm,
    eval_results,
    execute,
    flow_result,
    flow_run_metrics,
    flow_run_url,
    open_flow_run,
)
from codemill.flows.evaluate import evaluate_resolved, gate_against_champion, latest_corpus
from codemill.flows.hooks import config_of, record_failure_on_mlflow, tag_current_flow_run
from codemill.flows.plan import Step, plan_pipeline
from codemill.flows.problems import plan_problem_steps
from codemill.flows.repo_tasks import plan_repo_task_steps
from codemill.lineage import Registry
from codemill.lineage import tags as T
from codemill.rl.envs import task_stage
from codemill.rl.metrics import counted_metrics
from codemill.store import ArtifactRef, ArtifactStore
from codemill.tasks.common import RunContext, StageResult
from codemill.tasks.ingest import fingerprint_sources_task
from codemill.tasks.problems import fingerprint_problem_sources_task, needs_corpus
from codemill.tasks.repo_tasks import STAGE as REPO_TASKS
from codemill.tasks.resolve_model import ResolvedModel, resolve_model, trained_model
from codemill.tasks.rl import (
    HELDOUT,
    ROLLOUTS_FILE,
    plan_rollouts,
    plan_update,
    plan_warm_start,
    policy_dir,
    rollouts_task,
    update_task,
)

HELDOUT_BEFORE, HELDOUT_AFTER = "heldout:before", "heldout:after"


def starting_model(ctx: RunContext, store: ArtifactStore, config: PipelineConfig, model: str | None) -> ResolvedModel:
    """``model`` (a LoggedModel id, a store artifact or an HF folder); empty = the champion, or with no
    champion yet the pipeline's own trained model (trained now unless it is in the store)."""
    if model:
        return resolve_model(ctx, model)
    champion = Registry(ctx.lineage(), config.gate.registered_model or config.name, config.gate.alias).champion()
    if champion and champion.get(T.MODEL_ID):
        return resolve_model(ctx, champion[T.MODEL_ID])
    steps = plan_pipeline(config, fingerprint_sources_task(config.ingest), store, until="train")
    return trained_model(ctx, execute(steps, ctx, store)["train"])


def plan_task_steps(config: PipelineConfig, store: ArtifactStore) -> list[Step]:
    """The steps that make the tasks ``rl.env`` runs: the problem set, or the repository tasks."""
    if task_stage(config.rl.env) == REPO_TASKS:
        return plan_repo_task_steps(config)
    ingest_sources = fingerprint_sources_task(config.ingest) if needs_corpus(config.problems) else None
    return plan_problem_steps(config, ingest_sources, fingerprint_problem_sources_task(config.problems), store)


def plan_rl_steps(config: PipelineConfig, start: ResolvedModel, problems: ArtifactRef,
                  store: ArtifactStore) -> list[Step]:
    """[warm start], held-out before, (rollouts, update) per iteration, held-out after. Planning touches nothing."""
    rl = config.rl
    hf_of: dict[str, str] = {start.ref.digest: start.hf_dir}

    def bind_policy(ref: ArtifactRef):
        def bind(ctx: RunContext, results: dict[str, StageResult]) -> dict[str, Any]:
            return {"policy_hf": hf_of.get(ref.digest) or policy_dir(ctx.store(), ref)}
        return bind

    steps: list[Step] = []
    policy = start.ref
    if rl.warm_start.max_steps > 0:
        plan = plan_warm_start(rl, config.train, policy, problems)
        steps.append(Step("warm-start", "rl", plan, update_task, {"cfg": rl, "train": config.train},
                          bind_policy(policy)))
        policy = store.ref_for(plan)
    first = policy
    ray = {"ray_address": config.ray_address}
    steps.append(Step(HELDOUT_BEFORE, "rl", plan_rollouts(rl, first, problems, None, HELDOUT), rollouts_task,
                      {"cfg": rl, **ray}, bind_policy(first)))
    for i in range(rl.iterations):
        rollouts = plan_rollouts(rl, policy, problems, i)
        steps.append(Step(f"rollouts:{i}", "rl", rollouts, rollouts_task, {"cfg": rl, **ray}, bind_policy(policy)))
        update = plan_update(rl, config.train, policy, store.ref_for(rollouts), i)

        def bind_update(ctx: RunContext, results: dict[str, StageResult], _policy: ArtifactRef = policy
                        ) -> dict[str, Any]:
            reference = hf_of.get(first.digest) or policy_dir(ctx.store(), first)
            return {**bind_policy(_policy)(ctx, results), "reference_hf": reference}

        steps.append(Step(f"update:{i}", "rl", update, update_task, {"cfg": rl, "train": config.train}, bind_update))
        policy = store.ref_for(update)
    steps.append(Step(HELDOUT_AFTER, "rl", plan_rollouts(rl, policy, problems, None, HELDOUT), rollouts_task,
                      {"cfg": rl, **ray}, bind_policy(policy)))
    return steps


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


def _run_name() -> str:
    """``<experiment>-rl-<algorithm>-<UTC date-time>`` (a deployment run passes the config as a dict)."""
    cfg = config_of(flow_run.parameters)
    return f"{cfg.name}-rl-{cfg.rl.algorithm.name}-{datetime.now(UTC):%Y%m%d-%H%M%S}"


@flow(name="rl", flow_run_name=_run_name, persist_result=True, log_prints=True,
      on_failure=[record_failure_on_mlflow], on_crashed=[record_failure_on_mlflow])
def rl(config: PipelineConfig = PipelineConfig(), model: str | None = None) -> dict[str, Any]:  # noqa: B008
    """RL for code (``config.rl``) from ``model`` (a LoggedModel id, a store artifact or an HF folder; empty =
    the champion) on the problem set ``config.problems``; then the final policy is evaluated and gated."""
    try:
        with flow_run_metrics(config, "rl"):
            return run_rl(config, model)
    finally:
        from codemill.rl.update_workers import close_live_workers

        close_live_vllm()  # the rollouts' vLLM engine (rl.rollout.engine vllm): its memory back for what follows
        close_live_workers()  # the update workers (rl.algorithm.workers run)


def run_rl(config: PipelineConfig, model: str | None) -> dict[str, Any]:
    """The ``rl`` flow's body (call it inside the flow)."""
    from codemill.evals.heldout import compare_pass_rates
    from codemill.report import reward_curve_png
    from codemill.rl.trajectory import read_rollouts

    logger = get_run_logger()
    tag_current_flow_run("rl")
    store, ctx, lineage, parent = open_flow_run(config, flow_run.name or "rl", flow_run.id, flow_run_url())
    verdict = None
    try:
        start = starting_model(ctx, store, config, model)
        stages = execute(plan_task_steps(config, store), ctx, store)
        problems = stages[task_stage(config.rl.env)].ref
        stages |= execute(plan_rl_steps(config, start, problems, store), ctx, store)
        final_key = f"update:{config.rl.iterations - 1}"
        final = ResolvedModel(ref=stages[final_key].ref, hf_dir=policy_dir(store, stages[final_key].ref),
                              model_id=stages[final_key].model_id or "")
        before = read_rollouts(store.local_path(stages[HELDOUT_BEFORE].ref) / ROLLOUTS_FILE).to_pylist()
        after = read_rollouts(store.local_path(stages[HELDOUT_AFTER].ref) / ROLLOUTS_FILE).to_pylist()
        heldout = compare_pass_rates(before, after)
        corpus = latest_corpus(store)
        evals = evaluate_resolved(ctx, store, config, final, corpus) if config.evaluate.suites else {}
        stages |= {f"eval:{k}": v for k, v in evals.items()}
        verdict = gate_against_champion(ctx, store, config, final, corpus, evals)
    except BaseException:
        lineage.end_run(parent, failed=True)
        raise
    table = iteration_table(stages, config.rl.iterations)
    for row in table:
        lineage.log_metrics(parent, {f"rl.{k}": float(v) for k, v in row.items()
                                     if isinstance(v, int | float) and k != "iteration"}, step=row["iteration"])
    h = heldout.as_dict()
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
        f"RL ({config.rl.algorithm.name}) per iteration; held-out pass rate {heldout.before.rate:.3f} -> "
        f"{heldout.after.rate:.3f} (gain {heldout.gain:+.3f}, 95% CI [{heldout.gain_ci_low:+.3f}, "
        f"{heldout.gain_ci_high:+.3f}], p={heldout.p_value:.3g}, {heldout.problems} problems)"))
    logger.info("held-out pass rate %.3f -> %.3f (gain %+.3f, p=%.3g)", heldout.before.rate, heldout.after.rate,
                heldout.gain, heldout.p_value)
    out = flow_result(lineage, parent, config, stages, final.model_id, verdict)
    return {**out, "heldout": h, "iterations": table, "evals": {k: v.summary for k, v in eval_results(stages).items()}}
