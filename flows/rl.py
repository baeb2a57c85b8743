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
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.common import eval_results
from codemill.flows.evaluate import gate_against_champion, latest_corpus
from codemill.flows.hooks import config_of, record_failure_on_mlflow
from codemill.flows.plan import plan_chain
from codemill.flows.rl_plan import HELDOUT_AFTER, HELDOUT_BEFORE, plan_rl
from codemill.flows.rl_report import publish_rl
from codemill.flows.run import FlowRun, open_run
from codemill.lineage import Registry
from codemill.lineage import tags as T
from codemill.tasks.ingest import fingerprint_sources_task
from codemill.tasks.resolve_model import ResolvedModel, resolve_model, trained_model
from codemill.tasks.rl import ROLLOUTS_FILE, policy_dir


def starting_model(run: FlowRun, config: PipelineConfig, model: str | None) -> ResolvedModel:
    """``model`` (a LoggedModel id, a store artifact or an HF folder); empty = the champion, or with no
    champion yet the pipeline's own trained model (trained now unless it is in the store)."""
    if model:
        return resolve_model(run.ctx, model)
    champion = Registry(run.lineage, config.gate.registered_model or config.name, config.gate.alias).champion()
    if champion and champion.get(T.MODEL_ID):
        return resolve_model(run.ctx, champion[T.MODEL_ID])
    steps = plan_chain(config, fingerprint_sources_task(config.ingest), run.store)
    return trained_model(run.ctx, run.execute(steps)["train"])


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
        return run_rl(config, model)
    finally:
        from codemill.rl.update_workers import close_live_workers

        close_live_workers()  # the update workers (rl.algorithm.workers run)


def run_rl(config: PipelineConfig, model: str | None) -> dict[str, Any]:
    """The ``rl`` flow's body (call it inside the flow)."""
    from codemill.evals.heldout import compare_pass_rates
    from codemill.rl.trajectory import read_rollouts

    logger = get_run_logger()
    with open_run(config, "rl") as run:
        start = starting_model(run, config, model)
        plan = plan_rl(config, start, run.store)
        stages = run.execute(plan.steps)
        final = ResolvedModel(ref=stages[plan.final].ref, hf_dir=policy_dir(run.store, stages[plan.final].ref),
                              model_id=stages[plan.final].model_id or "")
        before = read_rollouts(run.store.local_path(stages[HELDOUT_BEFORE].ref) / ROLLOUTS_FILE).to_pylist()
        after = read_rollouts(run.store.local_path(stages[HELDOUT_AFTER].ref) / ROLLOUTS_FILE).to_pylist()
        heldout = compare_pass_rates(before, after)
        corpus = latest_corpus(run.store)
        evals = eval_results(run.execute(plan.evaluations.steps(final.ref, corpus, resolved=final))) \
            if config.evaluate.suites else {}
        stages |= {f"eval:{k}": v for k, v in evals.items()}
        verdict = gate_against_champion(run, plan.gate, final, corpus, evals) if plan.gate is not None else None
        table = publish_rl(run, config.rl.algorithm.name, config.rl.iterations, stages, final, heldout)
        logger.info("held-out pass rate %.3f -> %.3f (gain %+.3f, p=%.3g)", heldout.before.rate,
                    heldout.after.rate, heldout.gain, heldout.p_value)
        out = run.finish(stages, final.model_id, verdict)
    return {**out, "heldout": heldout.as_dict(), "iterations": table,
            "evals": {k: v.summary for k, v in eval_results(stages).items()}}
