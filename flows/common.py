"""What every flow reads of its steps' results (running them is ``flows.run``)."""

from __future__ import annotations

from typing import Any

from codemill.config import PipelineConfig
from codemill.tasks.common import StageResult
from codemill.tasks.fanout import task_runner_for


def eval_results(stages: dict[str, StageResult]) -> dict[str, StageResult]:
    """A run's evaluation steps (keyed ``eval:<suite>``), by suite."""
    return {k.removeprefix("eval:"): v for k, v in stages.items() if k.startswith("eval:")}


def scores_of(stages: dict[str, StageResult]) -> dict[str, float]:
    """The eval scores (and their CI bounds) of a run's evaluation steps."""
    out: dict[str, float] = {}
    for result in eval_results(stages).values():
        out |= {k: v for k, v in result.summary.items() if isinstance(v, float)}
    return out


def with_task_runner(flow_obj: Any, config: PipelineConfig) -> Any:
    """``flow_obj`` on the task runner ``config.ray_address`` asks for (unchanged when none is configured)."""
    runner = task_runner_for(config)
    return flow_obj if runner is None else flow_obj.with_options(task_runner=runner)
