"""The ``repo_tasks`` flow: repository tasks (imported SWE-bench instances, bug injection) as one
content-addressed artifact, with one MLflow parent run per flow run. The repositories' commits are resolved
(planned) before anything runs; a missing one stops the flow in one line."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.hooks import record_failure_on_mlflow, run_name_from
from codemill.flows.plan import Step, repo_task_steps
from codemill.flows.run import open_run
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
    logger = get_run_logger()
    with open_run(config, "repo_tasks") as run:
        stages = run.execute(plan_repo_task_steps(config))
        run.tag_stages(stages)
        for name, st in stages.items():
            logger.info("%-10s %-8s %s", name, st.status, st.ref.uri)
        return run.finish(stages)
