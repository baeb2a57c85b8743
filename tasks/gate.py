"""Prefect task of the gate: compare the candidate with the champion on the same items, promote or not."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

import codemill.metrics
from codemill.config import GateConfig
from codemill.evals import suites
from codemill.evals.calibration import mean_scores, noise_of, spread
from codemill.evals.gate import GateMetric, gate, markdown_report
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
              calibration: dict[str, Any] | None = None,
              candidate_seed_evals: dict[int, dict[str, StageResult]] | None = None) -> dict[str, Any]:
    """``calibration``: what ``evals.calibration.gate_noise`` found of the champion's seed noise (None: the gate
    is uncalibrated with the floors of ``evals.noise`` as hold margins). ``candidate_seed_evals``: with
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
        champ = _scores(ctx, champion_evals or {})
        per_seed = [_scores(ctx, e) for e in (candidate_seed_evals or {0: candidate_evals}).values()]
        cand = per_seed[0] if len(per_seed) == 1 else mean_scores(per_seed)
        run_noise = spread(per_seed) if len(per_seed) > 1 else None
        metrics = [GateMetric(m.name, m.margin, m.uncalibrated_margin) for m in cfg.metrics
                   if m.name in cand and m.name in champ]
        if not metrics:
            raise ValueError(f"no gate metric was evaluated for both models (configured: "
                             f"{[m.name for m in cfg.metrics]}, evaluated: {sorted(cand)})")
        cal = calibration or {}
        noise = noise_of(cal) if cal.get("metrics") else None
        verdict = gate(cand, champ, metrics, cfg.alpha, noise, cal.get("uri") if noise else None,
                       cal.get("hold_margins"), cal.get("advice", "codemill calibrate"), run_noise, len(per_seed),
                       cal.get("hold_margins_from"))
        result = verdict.as_dict()
        version = registry.promote(candidate.model_id, model_tags(candidate)) if verdict.verdict == "promote" \
            else champion["version"]
    result |= {"registered_model": registered_model, "alias": cfg.alias, "champion_version": version,
               "candidate_model_id": candidate.model_id,
               "previous_champion_model_id": (champion or {}).get(T.MODEL_ID),
               "mlflow_run_id": ctx.parent_run_id, "tracking_uri": ctx.tracking_uri,
               "noise_source": (calibration or {}).get("source", "none"),
               "calibrate_advice": (calibration or {}).get("advice", "codemill calibrate"),
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
    from codemill.evals.gate import GateVerdict, MetricEvidence

    v = GateVerdict(result["verdict"], result["alpha"], result["reason"],
                    [MetricEvidence(**m) for m in result["metrics"]], result.get("calibrated", False),
                    result.get("calibration"))
    links = (f"\n- MLflow run: `{result.get('mlflow_run_id')}` ({result.get('tracking_uri')})"
             f"\n- candidate model: `{result['candidate_model_id']}` (models:/{result['candidate_model_id']})"
             f"\n- champion before: "
             f"`{result['previous_champion_model_id']}`\n- registered model: `{result['registered_model']}` "
             f"@{result['alias']} = version {result['champion_version']}\n")
    return markdown_report(v, "codemill gate") + links
