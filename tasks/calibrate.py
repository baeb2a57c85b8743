"""Prefect task of the calibrate stage: the seed noise of one config from its seeds' evaluations, as an artifact
linked in MLflow to the recipe key, the registered model and every seed's LoggedModel."""

from __future__ import annotations

import json
from typing import Any

from prefect import get_run_logger

from codemill.evals import suites
from codemill.gate import calibration as cal
from codemill.gate import preset_noise as pn
from codemill.gate.scores import calibrate
from codemill.lineage import Lineage
from codemill.plan import StagePlan
from codemill.store import ArtifactRef, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task


def plan_calibration(config_key: str, recipe_key: str, evals: dict[int, dict[str, ArtifactRef]]) -> StagePlan:
    """Digest over the keys and every seed's evaluation artifacts (which hash the model, the data and the suite
    config): the same seeds evaluated the same way give the same calibration."""
    inputs = {f"seed{seed}.{suite}": ref for seed, by_suite in sorted(evals.items())
              for suite, ref in sorted(by_suite.items())}
    return StagePlan(stage=cal.STAGE, name=cal.NAME, code_version=cal.CODE_VERSION,
                     config={"config_key": config_key, "recipe_key": recipe_key, "seeds": sorted(evals)},
                     inputs=inputs)


def _summary(m: Manifest) -> dict[str, Any]:
    return {"config_key": m.config["config_key"], "recipe_key": m.config["recipe_key"],
            "n_seeds": m.stats["n_seeds"], "metrics": m.stats["metrics"]}


@stage_task("calibrate")
def calibrate_task(plan: StagePlan, ctx: RunContext, registered_model: str,
                   models: dict[int, dict[str, str]]) -> StageResult:
    """``models``: seed -> {"model_id", "digest"} of each seed's trained model."""
    logger = get_run_logger()
    store = ctx.store()
    key = plan.config["recipe_key"]

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        import polars as pl

        per_seed = []
        suite_digests: dict[str, str] = {}
        for seed in plan.config["seeds"]:
            scores: dict[str, Any] = {}
            for name, ref in plan.inputs.items():
                if name.startswith(f"seed{seed}."):
                    rows = pl.read_parquet(store.local_path(ref) / suites.rows_file(ref.name))
                    scores |= suites.item_scores(ref.name, rows)
                    suite_cfg = store.read_manifest(ref).config  # {"suite": its settings, "seed": the eval seed}
                    suite_digests[ref.name] = pn.suite_digest({ref.name: suite_cfg["suite"],
                                                               "seed": suite_cfg["seed"]}, ref.name)
            per_seed.append(scores)
        noise = calibrate(per_seed)
        seeds = [{"seed": s, **models.get(s, {})} for s in plan.config["seeds"]]
        payload = {"config_key": plan.config["config_key"], "recipe_key": key, "suite_digests": suite_digests,
                   "seeds": seeds, "metrics": {k: v.as_dict() for k, v in noise.items()}}
        w.path(cal.NOISE_FILE).write_text(json.dumps(payload, indent=2))
        for name, n in noise.items():
            logger.info("calibrate %s: %d seeds, seed SD %.4f, item SE %.4f", name, n.n_seeds, n.seed_sd, n.item_se)
        return w.finish({"n_seeds": len(seeds), "metrics": payload["metrics"]})

    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        ref = store.ref(m.stage, m.name, m.digest)
        lineage.log_artifact(run_id, store.local_path(ref) / cal.NOISE_FILE)
        model_ids = [v["model_id"] for v in models.values() if v.get("model_id")]
        lineage.link_calibration(run_id, key, ref, registered_model, model_ids, m.stats["metrics"])
        return {}

    return run_stage(ctx, plan, produce, record, _summary)
