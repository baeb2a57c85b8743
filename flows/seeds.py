"""Several seeds of one config in one flow run: the data stages once, then a training and the evaluations per
seed (``flows.plan.plan_seed``). ``calibrate`` trains N seeds (on Ray at once when there is one) for the seed
noise of a config; a ``pipeline`` with ``train.seeds`` plans its extra seeds as steps, and the gate reads their
evaluations by seed."""

from __future__ import annotations

from dataclasses import dataclass

from codemill.config import PipelineConfig
from codemill.flows.common import eval_results
from codemill.flows.plan import EvalPlan, Step, plan_seed, seed_key
from codemill.flows.run import run_stage_task
from codemill.store import ArtifactStore
from codemill.tasks.common import RunContext, StageResult
from codemill.tasks.fanout import on_ray


@dataclass
class SeedRuns:
    """Per seed its training and its evaluations (by suite)."""

    trained: dict[int, StageResult]
    evals: dict[int, dict[str, StageResult]]

    def stages(self) -> dict[str, StageResult]:
        """As a run summary lists them: ``seed<N>:train``, ``seed<N>:<suite>``."""
        out = {seed_key(seed, "train"): t for seed, t in self.trained.items()}
        for seed, by_suite in self.evals.items():
            out |= {seed_key(seed, suite): r for suite, r in by_suite.items()}
        return out


def _train_all(steps: dict[int, Step], ctx: RunContext, store: ArtifactStore) -> dict[int, StageResult]:
    """Each seed's training: Ray tasks at once when the flow runs on Ray, else one after another (each
    already uses every core)."""
    if not on_ray():
        return {seed: run_stage_task(step.task, store, plan=step.plan, ctx=ctx, **step.params)
                for seed, step in steps.items()}
    futures = {seed: step.task.submit(plan=step.plan, ctx=ctx, **step.params) for seed, step in steps.items()}
    out = {}
    for seed, future in futures.items():
        future.wait()
        result: StageResult = future.state.result()
        out[seed] = result.model_copy(update={"status": "cached", "cost": {}}) if future.state.name == "Cached" \
            else result
    return out


def train_and_evaluate(config: PipelineConfig, sources: list[dict], seeds: list[int], evaluations: EvalPlan,
                       ctx: RunContext, store: ArtifactStore) -> SeedRuns:
    """Train and evaluate ``config`` at each seed (the data stages and the steps the suites need must have run:
    they are the same for all)."""
    plans = {seed: plan_seed(config, sources, store, seed, evaluations) for seed in seeds}
    trained = _train_all({seed: next(s for s in p if s.phase == "train") for seed, p in plans.items()}, ctx, store)
    evals: dict[int, dict[str, StageResult]] = {}
    for seed, steps in plans.items():
        results = {seed_key(seed, "train"): trained[seed]}
        for step in (s for s in steps if s.phase == "evaluate"):
            bound = step.bind(ctx, results) if step.bind else {}
            done = run_stage_task(step.task, store, plan=step.plan, ctx=ctx, **step.params, **bound)
            evals.setdefault(seed, {})[step.plan.name] = done
    return SeedRuns(trained, evals)


def seed_evals(seeds: list[int], stages: dict[str, StageResult]) -> dict[int, dict[str, StageResult]] | None:
    """A ``train.seeds`` run's evaluations by seed (``RunPlan.seeds``: the candidate's own first; None for one
    seed)."""
    if len(seeds) < 2:
        return None
    own = eval_results(stages)
    return {seeds[0]: own, **{seed: {suite: stages[seed_key(seed, suite)] for suite in own} for seed in seeds[1:]}}
