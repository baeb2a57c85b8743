"""The ``repo_tasks`` flow: repository tasks (imported SWE-bench instances, bug injection) as one
content-addressed artifact, with one MLflow parent run per flow run. The repositories' commits are resolved
(planned) before anything runs; a missing one stops the flow in one line."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.common import execute, flow_result, flow_run_metrics, flow_run_url, open_flow_run
from codemill.flows.hooks import record_failure_on_mlflow, run_name_from, tag_current_flow_run
from codemill.flows.plan import Step, repo_task_steps
from codemill.lineage import tags as T
from codemill.tasks.repo_tasks import STAGE


def plan_repo_task_steps(config: PipelineConfig) -> list[Step]:
    """The ``repo_tasks`` step of ``config``."""
    return repo_task_steps(config.repo_tasks, phase=STAGE)


def _run_name() -> str:
    return run_name_from(flow_run.flow_name or "repo_tasks", flow_run.parameters)


@flow(name="repo_tasks", flow_run_name=_run_name, persist_result=True, log_prints=True,
      on_failure=[record_failure_on_mlflow], on_crashed=[record_failure_on_mlflow])
def repo_tasks(config: PipelineConfig = PipelineConfig()) -> dict[str, Any]:  # noqa: B008
    """Repository tasks from ``config.repo_tasks.sources``: validated in the sandbox, decontaminated, split by
    repository, with the snapshots they start from."""
    with flow_run_metrics(config, "repo_tasks"):
        logger = get_run_logger()
        tag_current_flow_run("repo_tasks")
        store, ctx, lineage, parent = open_flow_run(config, flow_run.name or "repo_tasks", flow_run.id,
                                                    flow_run_url())
        try:
            stages = execute(plan_repo_task_steps(config), ctx, store)
        except BaseException:
            lineage.end_run(parent, failed=True)
            raise
        lineage.tag(parent, {**{T.stage_status(k): v.status for k, v in stages.items()},
                             **{T.stage_digest(k): v.ref.digest for k, v in stages.items()}})
        for name, st in stages.items():
            logger.info("%-10s %-8s %s", name, st.status, st.ref.uri)
        return flow_result(lineage, parent, config, stages, None, None)
