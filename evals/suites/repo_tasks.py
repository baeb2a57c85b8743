"""Repository tasks: the model as an agent in the ``repo`` environment (``codemill.rl.envs.repo``) on the held-out
tasks of a ``repo_tasks`` artifact, graded by the same code as RL's reward and ``codemill repo-tasks grade``.

One row per episode (``samples`` per task, seeded by the eval seed, greedy at temperature 0); its item is the
episode, its cluster the task's repository (tasks of one repository share code, tests and failure modes, so the
CI resamples repositories). ``repo_tasks_resolved`` is the share of episodes whose task was resolved. An episode
that ended on a limit (turns, tool calls, tokens, wall clock) is graded on the tree it left, as SWE-bench grades
an agent's final diff; ``repo_tasks_limits_hit`` counts them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import polars as pl
from pydantic import Field

from codemill.evals.stats import ItemScores
from codemill.evals.suites.base import Metric, Need, Rows, Suite, SuiteRun, ci, scores
from codemill.rl.envs.repo import END_OF_TURN, RepoEnvConfig
from codemill.stage_config import StageConfig

if TYPE_CHECKING:
    from codemill.config import PipelineConfig


class RepoTasksSuiteConfig(StageConfig):
    """Held-out repository tasks solved by the model as an agent in the ``repo`` environment: the resolved rate,
    with a CI clustered by repository (codemill.evals.suites.repo_tasks). The tasks are the `repo_tasks`
    artifact the config `repo_tasks` builds."""

    split: Literal["train", "val"] = Field("val", description="Which tasks: val, the repositories RL never sees.")
    max_tasks: int | None = Field(None, ge=1, description="The first N tasks (by id); empty = all.")
    samples: int = Field(1, ge=1, description="Episodes per task.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0 = greedy).")
    max_new_tokens: int = Field(512, gt=0, description="Most tokens of one agent turn.")
    context_len: int = Field(8192, ge=64, description="Most tokens of an episode (prompt, turns, tool output).")
    batch_size: int = Field(4, ge=1, description="Tasks generated together.")
    env: RepoEnvConfig = Field(default_factory=RepoEnvConfig, description="The episodes' limits and "
                               "tools prompt, as in rl.env.")


PREFIX = "repo_tasks_"  # the summary's numbers: logged on the evaluation run and kept in the flow's result
RESOLVED = Metric(f"{PREFIX}resolved", binary=True)
REPO_TASKS_CODE_VERSION = "repo-tasks-suite-v1"
TASKS_STAGE = "repo_tasks"  # the stage that builds the task set (``codemill repo-tasks build``), planned before


def needs(config: PipelineConfig) -> tuple[Need, ...]:
    """The task set of ``config.repo_tasks``, built (or found in the store) before the suite, as its ``data``."""
    if not config.repo_tasks.sources:
        raise ValueError("evaluate.suites has repo_tasks, but repo_tasks.sources is empty: nothing to evaluate on")
    return (Need(TASKS_STAGE, config.repo_tasks, "data"),)


def run(r: SuiteRun) -> Rows:
    from codemill.models.engines import RolloutParams
    from codemill.rl.env import CUT_REASONS, EnvContext
    from codemill.rl.envs import opened
    from codemill.rl.envs.repo import RepoEnv
    from codemill.rl.metrics import rollout_metrics
    from codemill.rl.rollout import collect_rollouts

    c = r.cfg.repo_tasks
    tasks_dir = r.inputs.get("data")
    if tasks_dir is None:
        raise ValueError("the repo_tasks suite needs a repo_tasks artifact (config repo_tasks)")
    tasks = sorted(RepoEnv.read_tasks(tasks_dir, c.split), key=lambda t: t.problem_id)[:c.max_tasks]
    if not tasks:
        raise ValueError(f"{tasks_dir}: no {c.split} repository tasks to evaluate on")
    params = RolloutParams(temperature=c.temperature, max_new_tokens=c.max_new_tokens, stop=(END_OF_TURN,))
    with r.model.engine(c.batch_size, c.context_len) as engine:
        ctx = EnvContext(None, engine.tokenizer, engine.max_context, c.max_new_tokens)
        with opened(RepoEnv(c.env, ctx)) as env:
            episodes, timings = collect_rollouts(engine, env, tasks, c.samples, params, r.cfg.seed,
                                                 batch_problems=c.batch_size, overlap=False)
    repo_of = {t.problem_id: t.task.repo for t in tasks}
    rows = pl.DataFrame([{
        "item_id": f"{e['problem_id']}#{e['sample']}", "cluster": repo_of[e["problem_id"]],
        "instance_id": e["problem_id"], "sample": e["sample"], "resolved": e["outcome"] == "passed",
        "outcome": e["outcome"], "finish_reason": e["finish_reason"],
        "turns": e["turns"], "tokens": len(e["prompt_ids"]) + len(e["completion_ids"]),
        "suspicious": e["suspicious"], "env_stats": e["env_stats"]} for e in episodes])
    resolved = rows["resolved"].to_numpy().astype(np.float64)
    clusters = np.unique(rows["cluster"].to_numpy(), return_inverse=True)[1]
    m = rollout_metrics(episodes, c.samples)  # what an RL iteration says of its episodes, counted the same way
    summary: dict[str, Any] = {
        **ci(resolved, np.ones_like(resolved), clusters, r.cfg, RESOLVED.name),
        f"{PREFIX}tasks": len(tasks), f"{PREFIX}repositories": len(set(repo_of.values())),
        f"{PREFIX}episodes": m["samples"], f"{PREFIX}turns_mean": m["turns_mean"],
        f"{PREFIX}limits_hit": sum(n for f, n in m["finish_reasons"].items() if f in CUT_REASONS),
        f"{PREFIX}suspicious": m["suspicious"], f"{PREFIX}wall_s": timings.wall_s,
        "tool_calls": m.get("tool_calls", {}), "outcomes": m["outcomes"]}
    return rows, summary


def item_scores(rows: pl.DataFrame) -> dict[str, ItemScores]:
    ordered = rows.sort("item_id").with_columns(pl.col("resolved").cast(pl.Float64).alias("resolved_score"))
    return {RESOLVED.name: scores(ordered, RESOLVED, "resolved_score")}


SUITE = Suite("repo_tasks", REPO_TASKS_CODE_VERSION, run, item_scores, (RESOLVED,),
              logged=(PREFIX,), uses_sandbox=lambda cfg: True, generates=True,
              settings=RepoTasksSuiteConfig, default=False, needs=needs, uses_overlay=True)
