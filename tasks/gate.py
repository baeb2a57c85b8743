"""Prefect task of the gate: compare the candidate with the champion on the same items, promote or not."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

import codemill.metrics
from codemill.evals import suites
from codemill.gate.config import GateConfig
from codemill.gate.evidence import GateMetric, NoiseSource, collect
from codemill.gate.policy import GateVerdict, MetricEvidence, decide
from codemill.gate.report import markdown_report
from codemill.lineage import Registry
from codemill.lineage import tags as T
from codemill.tasks.common import RunContext, StageResult
from codemill.tasks.evaluate import load_rows
from codemill.tasks.resolve_model import ResolvedModel


def _scores(ctx: RunContext, evals: dict[str, StageResult]) -> dict:
    out: dict[str, Any] = {}
    for suite, result in evals.items():
        out |= suites.item_scores(suite, load_rows(ctx, result))
    return out


def model_tags(model: ResolvedModel) -> dict[str, str]:
    return {T.MODEL_DIGEST: model.ref.digest, T.MODEL_URI: model.ref.uri, T.HF_DIR: model.hf_dir}


@task(name="gate", retries=2, retry_delay_seconds=5)
def gate_task(ctx: RunContext, cfg: GateConfig, registered_model: str, candidate: ResolvedModel,
              candidate_evals: dict[str, StageResult], champion: dict[str, str] | None,
              champion_evals: dict[str, StageResult] | None,
              noise: NoiseSource | None = None,
              candidate_seed_evals: dict[int, dict[str, StageResult]] | None = None) -> dict[str, Any]:
    """``noise``: what ``gate.calibration.noise_source`` found of the champion's seed noise (None: the gate is
    uncalibrated with the metrics' floors as hold margins). ``candidate_seed_evals``: with
    ``train.seeds`` > 1, every seed's evaluations (the candidate's own included): the gate compares their mean
    and adds their spread to the seed noise."""
    logger = get_run_logger()
    lineage = ctx.lineage()
    registry = Registry(lineage, registered_model, cfg.alias)
    if champion is None:
        version = registry.promote(candidate.model_id, model_tags(candidate))
        result = {"verdict": "promote", "reason": "first evaluated model: it becomes the champion", "metrics": [],
                  "alpha": cfg.alpha}
    elif champion.get(T.MODEL_ID) == candidate.model_id:
        version = champion["version"]
        result = {"verdict": "hold", "reason": "the candidate is the champion", "metrics": [], "alpha": cfg.alpha}
    else:
        per_seed = [_scores(ctx, e) for e in (candidate_seed_evals or {0: candidate_evals}).values()]
        metrics = [GateMetric(m.name, m.margin, m.uncalibrated_margin) for m in cfg.metrics]
        verdict = decide(collect(per_seed, _scores(ctx, champion_evals or {}), metrics, noise), cfg.alpha)
        result = verdict.as_dict()
        version = registry.promote(candidate.model_id, model_tags(candidate)) if verdict.verdict == "promote" \
            else champion["version"]
    result |= {"registered_model": registered_model, "alias": cfg.alias, "champion_version": version,
               "candidate_model_id": candidate.model_id,
               "previous_champion_model_id": (champion or {}).get(T.MODEL_ID),
               "mlflow_run_id": ctx.parent_run_id, "tracking_uri": ctx.tracking_uri,
               "noise_source": (noise or NoiseSource()).source,
               "calibrate_advice": (noise or NoiseSource()).advice,
               "candidate_seeds": sorted(candidate_seed_evals or [])}
    codemill.metrics.get().gate_verdicts.labels(result["verdict"]).inc()
    report = _report(result)
    create_markdown_artifact(report, key="gate-verdict", description=f"gate verdict: {result['verdict']}")
    if ctx.parent_run_id:
        lineage.log_text(ctx.parent_run_id, report, "gate_report.md")
        lineage.log_json(ctx.parent_run_id, result, "gate_verdict.json")
        lineage.tag(ctx.parent_run_id, {T.GATE_VERDICT: result["verdict"], T.GATE_CHAMPION_VERSION: version})
    logger.info("gate: %s (%s)", result["verdict"], result["reason"])
    return result


def _report(result: dict[str, Any]) -> str:
    v = GateVerdict(result["verdict"], result["alpha"], result["reason"],
                    [MetricEvidence(**m) for m in result["metrics"]], result.get("calibrated", False),
                    result.get("calibration"))
    links = (f"\n- MLflow run: `{result.get('mlflow_run_id')}` ({result.get('tracking_uri')})"
             f"\n- candidate model: `{result['candidate_model_id']}` (models:/{result['candidate_model_id']})"
             f"\n- champion before: "
             f"`{result['previous_champion_model_id']}`\n- registered model: `{result['registered_model']}` "
             f"@{result['alias']} = version {result['champion_version']}\n")
    return markdown_report(v, "codemill gate") + links
