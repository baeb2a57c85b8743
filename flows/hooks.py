"""Flow-run naming, tagging and the failure hook every codemill flow shares."""

from __future__ import annotations

import traceback
from datetime import UTC, datetime
from typing import Any

from codemill.config import PipelineConfig


def config_of(parameters: dict[str, Any]) -> PipelineConfig:
    cfg = parameters.get("config")
    return cfg if isinstance(cfg, PipelineConfig) else PipelineConfig.model_validate(cfg or {})


def run_name_from(flow_name: str, parameters: dict[str, Any], now: datetime | None = None) -> str:
    """``<experiment>-<flow>[-until-<stage>]-s<max_steps>-<UTC date-time>``: what ran, on what, when."""
    cfg = config_of(parameters)
    until = parameters.get("until")
    parts = [cfg.name, flow_name]
    if until and until != "evaluate":
        parts.append(f"until-{until}")
    parts.append(f"s{cfg.train.max_steps}")
    return "-".join(parts + [f"{(now or datetime.now(UTC)):%Y%m%d-%H%M%S}"])


def run_tags(flow_name: str, parameters: dict[str, Any]) -> list[str]:
    cfg = config_of(parameters)
    tags = ["codemill", f"flow:{flow_name}", f"experiment:{cfg.name}", f"parallelism:{cfg.train.parallelism}"]
    if parameters.get("until"):
        tags.append(f"until:{parameters['until']}")
    if cfg.ray_address:
        tags.append("ray")
    return tags


def tag_current_flow_run(flow_name: str) -> None:
    """Add codemill's tags to this flow run (deployment tags are kept), so runs filter by experiment/flow."""
    from prefect import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run.id)
        tags = sorted(set(run.tags) | set(run_tags(flow_name, flow_run.parameters)))
        client.update_flow_run(flow_run.id, tags=tags)


def record_failure_on_mlflow(flow, flow_run, state) -> None:
    """on_failure hook: mark this flow run's MLflow parent run FAILED with the error, so MLflow shows why.

    Best effort: when the tracking server itself is what failed, the hook says so in the Prefect log."""
    from prefect.logging import get_logger

    from codemill.lineage import Lineage
    from codemill.lineage import tags as T

    logger = get_logger("codemill.hooks")
    try:
        cfg = config_of(flow_run.parameters)
        lineage = Lineage(cfg.mlflow_tracking_uri, cfg.name)
        runs = lineage.flow_runs(str(flow_run.id))
        message = state.message or "failed"
        for run_id in runs:
            lineage.tag(run_id, {T.FAILURE: message[:4000], T.FAILED_STATE: state.name})
            lineage.log_text(run_id, message, "failure.txt")
            lineage.end_run(run_id, failed=True)
        if not runs:
            logger.warning("flow run %s failed before its MLflow run was created: %s", flow_run.id, message)
    except Exception:  # the hook must never mask the original failure
        logger.warning("could not record the failure on MLflow:\n%s", traceback.format_exc())
