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
from codemill.flows.hooks import record_failure_on_mlflow, run_name_from
from codemill.flows.nightly import champion_start
from codemill.flows.plan import plan_chain, plan_evaluations
from codemill.flows.run import open_run, run_stage_task
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
    registered = config.gate.registered_model or config.name
    with open_run(config, "calibrate") as run:
        sources = fingerprint_sources_task(config.ingest)
        chain = plan_chain(config, sources, run.store)
        evaluations = plan_evaluations(config, run.store)
        train_plan = chain[-1].plan
        key = cal.config_key(train_plan.code_version, train_plan.config, train_plan.input_digests)
        recipe = cal.recipe_key(cal.recipe_of_plans([s.plan for s in chain]))
        existing = sorted(cal.seeds_of_key(run.store, key))
        chosen = choose_seeds(config.train.seed, seeds, existing)
        logger.info("calibrating %s on seeds %s (already trained: %s)", key[:12], chosen, existing)
        # The data stages and the steps the suites need are the same for every seed: built once, here.
        stages = run.execute([s for s in chain if s.phase != "train"] + evaluations.needs)
        runs = train_and_evaluate(config, sources, chosen, evaluations, run.ctx, run.store)
        stages |= runs.stages()
        models = {seed: {"model_id": t.model_id or "", "digest": t.ref.digest} for seed, t in runs.trained.items()}
        evaluated = {seed: {k: v.ref for k, v in by.items()} for seed, by in runs.evals.items()}
        plan = plan_calibration(key, recipe, evaluated)
        stages["calibrate"] = run_stage_task(calibrate_task, run.store, plan=plan, ctx=run.ctx,
                                             registered_model=registered, models=models)
        result = calibration_result(stages["calibrate"], config, key, recipe, models)
        run.lineage.tag(run.parent, {T.RECIPE_KEY: recipe})
        run.lineage.log_metrics(run.parent, {f"{r['metric']}_{k}": r[k] for r in result["metrics"]
                                             for k in ("seed_sd", "item_se", "mde_better")})
        _publish(result, stages, run.lineage.tracking_uri, run.lineage.experiment_id, run.parent)
        out = run.finish(stages)
    return {**result, "parent_run_id": out["parent_run_id"], "experiment_id": out["experiment_id"],
            "tracking_uri": out["tracking_uri"], "flow_run_id": out["flow_run_id"], "registered_model": registered,
            "stages": out["stages"]}


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
