"""The ``rl`` flow's plan, made before anything of it runs: the steps that make the tasks ``rl.env`` runs, then
[warm start], held-out rollouts of the starting policy, (rollouts, update) per iteration, held-out rollouts of
the final policy; and how the final policy is evaluated and gated. Planning touches nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from codemill.config import PipelineConfig
from codemill.flows.plan import EvalPlan, GatePlan, Step, plan_evaluations, plan_gate
from codemill.flows.problems import plan_problem_steps
from codemill.flows.repo_tasks import plan_repo_task_steps
from codemill.rl.envs import task_stage
from codemill.store import ArtifactRef, ArtifactStore
from codemill.tasks.common import RunContext, StageResult
from codemill.tasks.ingest import fingerprint_sources_task
from codemill.tasks.problems import fingerprint_problem_sources_task, needs_corpus
from codemill.tasks.repo_tasks import STAGE as REPO_TASKS
from codemill.tasks.resolve_model import ResolvedModel
from codemill.tasks.rl import (
    HELDOUT,
    plan_rollouts,
    plan_update,
    plan_warm_start,
    policy_dir,
    rollouts_task,
    update_task,
)

HELDOUT_BEFORE, HELDOUT_AFTER = "heldout:before", "heldout:after"


@dataclass(frozen=True)
class RLPlan:
    """A planned ``rl`` run: what the flow carries instead of its config."""

    steps: list[Step]
    final: str  # the step key of the final policy's update
    evaluations: EvalPlan
    gate: GatePlan | None  # None: the gate is off


def plan_rl(config: PipelineConfig, start: ResolvedModel, store: ArtifactStore) -> RLPlan:
    """Every step of an ``rl`` run from ``start``, and the evaluation and gate of its final policy."""
    tasks = plan_task_steps(config, store)
    steps = [*tasks, *plan_rl_steps(config, start, store.ref_for(tasks[-1].plan), store)]
    evaluations = plan_evaluations(config, store)
    return RLPlan(steps, f"update:{config.rl.iterations - 1}", evaluations, plan_gate(config, evaluations))


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
