"""The ``calibrate`` flow: train N seeds of one config, evaluate each, and store the between-seed noise of every
metric, which the gate then adds to the item-level noise when this config's model is the champion.

The data stages are planned once and are the same for every seed (so they are cached after the first run);
only training and evaluation run per seed. Trainings already in the store whose config differs only in the
seed count as seeds too (their training and evaluation are found, not redone). With ``ray_address`` set the
trainings fan out as Ray tasks; otherwise they run one after another (each already uses every core).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.artifacts import mlflow_ui_links
from codemill.flows.common import execute, flow_run_metrics, flow_run_url, open_flow_run, run_stage_task
from codemill.flows.hooks import record_failure_on_mlflow, run_name_from, tag_current_flow_run
from codemill.flows.nightly import champion_start
from codemill.flows.plan import DATA_FOR_EVALS, plan_pipeline
from codemill.flows.seeds import train_and_evaluate
from codemill.gate import calibration as cal
from codemill.lineage import tags as T
from codemill.tasks.calibrate import calibrate_task, plan_calibration
from codemill.tasks.common import StageResult
from codemill.tasks.ingest import fingerprint_sources_task

DEFAULT_SEEDS = 10  # 5 leave the t test 4 degrees of freedom: too few to see tiny's 2x-steps gain


def choose_seeds(base: int, n: int, existing: list[int]) -> list[int]:
    """Every seed already trained, then base, base + 1, ... until there are ``n``."""
    seeds = sorted(set(existing))
    candidate = base
    while len(seeds) < n:
        if candidate not in seeds:
            seeds.append(candidate)
        candidate += 1
    return seeds


def _run_name() -> str:
    return run_name_from("calibrate", flow_run.parameters)


@flow(name="calibrate", flow_run_name=_run_name, persist_result=True, log_prints=True,
      on_failure=[record_failure_on_mlflow], on_crashed=[record_failure_on_mlflow])
def calibrate(config: PipelineConfig = PipelineConfig(), seeds: int = DEFAULT_SEEDS,  # noqa: B008
              from_champion: bool = False) -> dict[str, Any]:
    """Train ``seeds`` seeds of ``config`` (existing trainings of it count), evaluate each on
    ``config.evaluate.suites``, store the per-metric between-seed variance and link it to the registered
    model. ``from_champion``: fine-tune every seed from the champion's weights, as ``nightly`` does, which
    calibrates the nightly chain's recipe (it stays calibrated when the champion changes)."""
    with flow_run_metrics(config, "calibrate"):
        return _calibrate(config, seeds, from_champion)


def _calibrate(config: PipelineConfig, seeds: int, from_champion: bool) -> dict[str, Any]:
    if seeds < 2:
        raise ValueError(f"a calibration needs at least 2 seeds, not {seeds}")
    logger = get_run_logger()
    if from_champion:
        start = champion_start(config)
        if start is None:
            raise ValueError("--from-champion: there is no champion yet to fine-tune from (run the pipeline first)")
        config = config.model_copy(update={"train": config.train.model_copy(update={"init_from": start})})
    tag_current_flow_run("calibrate")
    store, ctx, lineage, parent = open_flow_run(config, flow_run.name or "calibrate", flow_run.id, flow_run_url())
    registered = config.gate.registered_model or config.name
    try:
        sources = fingerprint_sources_task(config.ingest)
        base = plan_pipeline(config, sources, store, "evaluate")
        train_plan = next(s for s in base if s.key == "train").plan
        key = cal.config_key(train_plan.code_version, train_plan.config, train_plan.input_digests)
        recipe = cal.recipe_key(cal.recipe_of_plans([s.plan for s in base]))
        existing = sorted(cal.seeds_of_key(store, key))
        chosen = choose_seeds(config.train.seed, seeds, existing)
        logger.info("calibrating %s on seeds %s (already trained: %s)", key[:12], chosen, existing)
        # The data stages and HumanEval's augmented tests are the same for every seed: built once, here.
        stages = execute([s for s in base if s.phase in ("ingest", "tokenize") or s.plan.stage in DATA_FOR_EVALS],
                         ctx, store)
        runs = train_and_evaluate(config, sources, chosen, ctx, store)
        stages |= runs.stages()
        trained, evals = runs.trained, runs.evals
        models = {seed: {"model_id": t.model_id or "", "digest": t.ref.digest} for seed, t in trained.items()}
        plan = plan_calibration(key, recipe, {seed: {k: v.ref for k, v in by.items()} for seed, by in evals.items()})
        stages["calibrate"] = run_stage_task(calibrate_task, store, plan=plan, ctx=ctx, registered_model=registered,
                                             models=models)
    except BaseException:
        lineage.end_run(parent, failed=True)
        raise
    result = calibration_result(stages["calibrate"], config, key, recipe, models)
    lineage.tag(parent, {T.RECIPE_KEY: recipe})
    lineage.log_metrics(parent, {f"{r['metric']}_{k}": r[k] for r in result["metrics"]
                                 for k in ("seed_sd", "item_se", "mde_better")})
    _publish(result, stages, lineage.tracking_uri, lineage.experiment_id, parent)
    lineage.end_run(parent)
    return {**result, "parent_run_id": parent, "experiment_id": lineage.experiment_id,
            "tracking_uri": config.mlflow_tracking_uri, "flow_run_id": str(flow_run.id) if flow_run.id else None,
            "registered_model": registered, "stages": {k: v.model_dump(mode="json") for k, v in stages.items()}}


def calibration_result(stage: StageResult, config: PipelineConfig, key: str, recipe: str,
                       models: dict[int, dict[str, str]]) -> dict[str, Any]:
    noise = cal.noise_of(stage.summary)
    margins = {m.name: m.margin for m in config.gate.metrics}
    return {"config_key": key, "recipe_key": recipe, "calibration": stage.ref.uri, "seeds": sorted(models),
            "models": models, "alpha": config.gate.alpha,
            "metrics": cal.summary_rows(noise, config.gate.alpha, margins)}


def calibration_markdown(result: dict[str, Any]) -> str:
    lines = [f"# Noise calibration of recipe {result['recipe_key'][:12]}", "",
             f"Seeds: {result['seeds']}; artifact: `{result['calibration']}`", "",
             "| metric | seeds | mean | seed SD | item SE | SE of a comparison | MDE better | MDE worse |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["metrics"]:
        lines.append(f"| {r['metric']} | {r['n_seeds']} | {r['mean']:.4f} | {r['seed_sd']:.4f} | {r['item_se']:.4f} "
                     f"| {r['se_total']:.4f} | {r['mde_better']:.4f} | {r['mde_worse']:.4f} |")
    lines += ["", "SE of a comparison = sqrt(item SE^2 + 2 x seed SD^2); MDE at 80% power, one-sided, "
              f"alpha {result['alpha']} / number of metrics."]
    return "\n".join(lines)


def _publish(result: dict[str, Any], stages: dict[str, StageResult], tracking_uri: str, experiment_id: str,
             parent: str) -> None:
    from prefect.artifacts import create_link_artifact, create_markdown_artifact

    from codemill.report import cost_section

    links = mlflow_ui_links(tracking_uri, experiment_id, parent, None)
    costs = {k: (v.status, v.cost) for k, v in stages.items()}
    body = [calibration_markdown(result), "", *(f"- {name}: {url}" for name, url in links.items()), "",
            *cost_section(costs)]
    create_markdown_artifact("\n".join(body), key="calibration",
                             description="seed noise per metric, MDE, cost per stage")
    for text, url in links.items():
        create_link_artifact(url, link_text=text, key=text.lower().replace(" ", "-"), description=text)
