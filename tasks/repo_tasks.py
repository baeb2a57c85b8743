"""Prefect task of the repo_tasks stage: validated repository tasks as one content-addressed artifact."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from codemill import progress
from codemill.lineage import Lineage
from codemill.plan import StagePlan, external_input
from codemill.repos.config import RepoTasksConfig
from codemill.store import ArtifactRef, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task

STAGE = "repo_tasks"


def fingerprint_repo_sources(cfg: RepoTasksConfig) -> list[dict[str, str]]:
    """What each source's tasks depend on, by content: an imported file's hash (its rows name their commits),
    each synthesis repository's resolved commit. A missing repository or commit stops here, before any work."""
    return [entry for i, src in enumerate(cfg.sources) for entry in src.fingerprint(i)]


def plan_repo_tasks(cfg: RepoTasksConfig, sources: list[dict[str, str]]) -> StagePlan:
    """The task set depends on its config and on every source's content (a file hash, a commit)."""
    from codemill.repos.taskset import REPO_TASKS_CODE_VERSION

    inputs = {s["key"]: external_input(s["kind"], s["name"], s["digest"], s["uri"]) for s in sources}
    return StagePlan(stage=STAGE, name="repo-tasks", code_version=REPO_TASKS_CODE_VERSION,
                     config=cfg.digest_config(), inputs=inputs)


@task(name="fingerprint-repo-task-sources", retries=0)
def fingerprint_repo_sources_task(cfg: RepoTasksConfig) -> list[dict[str, str]]:
    progress.sink().stage(STAGE, "resolving repositories")
    return fingerprint_repo_sources(cfg)


def _summary(m: Manifest) -> dict[str, Any]:
    return {k: m.stats[k] for k in ("tasks", "splits", "repositories", "contaminated", "by_operator")}


def _record(plan: StagePlan):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        lineage.log_dataset_input(run_id, ArtifactRef(stage=m.stage, name=m.name, digest=m.digest, uri=m.uri),
                                  "output", name="repo_tasks")
        lineage.tag(run_id, {f"codemill.repo_source.{k}": f"{v.name}@{v.digest}" for k, v in plan.inputs.items()})
        st = m.stats
        lineage.log_metrics(run_id, {"tasks": st["tasks"], "contaminated": st["contaminated"],
                                     **{f"{k}.tasks": v for k, v in st["splits"].items()},
                                     **{f"operator.{k}": v for k, v in st["by_operator"].items()}})
        lineage.log_table(run_id, [{"source": y["source"], "kind": y["kind"],
                                    **{k: v for k, v in y.items() if k not in ("source", "kind")}}
                                   for y in st["yield"]], "repo_tasks_yield.json")
        return {}
    return record


@stage_task("repo_tasks")
def repo_tasks_task(plan: StagePlan, ctx: RunContext, cfg: RepoTasksConfig) -> StageResult:
    from codemill.cpus import usable_cpus
    from codemill.repos.cache import RepoCache
    from codemill.repos.taskset import build_task_set

    logger = get_run_logger()

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        stats = build_task_set(cfg, w.dir, RepoCache(), cfg.workers or usable_cpus(),
                               say=lambda msg: progress.sink().stage(STAGE, msg))
        logger.info("repo_tasks: %d tasks (train %d, val %d) from %s", stats["tasks"], stats["splits"]["train"],
                    stats["splits"]["val"], ", ".join(stats["repositories"]))
        return w.finish(stats)

    return run_stage(ctx, plan, produce, _record(plan), _summary)
