"""Prefect task of the evaluate stage: one content-addressed artifact per (suite, model, data, config)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prefect import get_run_logger

from codemill import metrics, progress
from codemill.evals import suites
from codemill.evals.config import EvalConfig
from codemill.evals.suites.base import Suite, SuiteRun
from codemill.lineage import Lineage
from codemill.lineage import tags as T
from codemill.plan import StagePlan, file_input
from codemill.store import ArtifactRef, ArtifactStore, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task
from codemill.tasks.resolve_model import ResolvedModel

STAGE = "evaluate"
SUMMARY_KEYS = tuple(k for s in suites.REGISTRY.values() for k in s.summary_keys)
CORPUS_STAGE = "ingest"  # a suite whose data is a corpus scores its val split


def val_dataset(corpus: ArtifactRef) -> ArtifactRef:
    """The val split, as a dataset: identified by the corpus digest it is a deterministic part of."""
    return ArtifactRef(stage=corpus.stage, name="corpus-val", digest=corpus.digest, uri=f"{corpus.uri}/val")


def suite_data(s: Suite, corpus: ArtifactRef | None, needed: Mapping[str, ArtifactRef]) -> ArtifactRef:
    """What a suite reads: what its needs built as ``data``, its own dataset (``Suite.dataset``), or the corpus
    (whose val split the text suites score)."""
    if "data" in needed:
        return needed["data"]
    if s.dataset is not None:
        return s.dataset()
    if corpus is None:
        raise ValueError(f"suite {s.name!r} needs a corpus (its val split)")
    return corpus


def logged_dataset(data: ArtifactRef) -> ArtifactRef:
    """The dataset the MLflow record names: the val split of a corpus, any other data as it is."""
    return val_dataset(data) if data.stage == CORPUS_STAGE else data


def plan_suite(suite: str, cfg: EvalConfig, model: ArtifactRef, corpus: ArtifactRef | None,
               samples_file: str | None = None, needed: Mapping[str, ArtifactRef] | None = None) -> StagePlan:
    """Digest over this suite's config (not the suite list), the model, the data, (when scoring a samples
    file) its content and the artifacts of the steps it needs (``needed``: input name -> ref, e.g. HumanEval's
    augmented tests): evaluations of one suite pair whenever these agree, whatever else ran beside them."""
    s = suites.get(suite)
    config = {"suite": s.config(cfg).digest_config(), **s.plan_config(cfg),
              **(suites.sampler_config(cfg) if s.generates else {}),
              "bootstrap_samples": cfg.bootstrap_samples, "confidence": cfg.confidence, "seed": cfg.seed}
    needed = needed or {}
    inputs = {"model": model, "data": suite_data(s, corpus, needed)}
    if samples_file:
        inputs["samples"] = file_input("samples", samples_file)
    inputs |= {name: ref for name, ref in needed.items() if name != "data"}
    return StagePlan(stage=STAGE, name=suite, code_version=suites.SUITE_VERSIONS[suite], config=config,
                     inputs=inputs)


def metrics_of(stats: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in stats.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and k.startswith(SUMMARY_KEYS)}


def _summary(m: Manifest) -> dict[str, Any]:
    """What the flow result keeps of an evaluation: its metrics, what it ran on (``Suite.described``), or why
    the suite skipped the model."""
    skipped = {"skipped": m.stats["skipped"]} if m.stats.get("skipped") else {}
    described = {k: m.stats[k] for k in suites.get(m.stats["suite"]).described if isinstance(m.stats.get(k), str)}
    return {"suite": m.stats["suite"], "model_id": m.stats["model_id"], **described, **skipped,
            **metrics_of(m.stats)}


def _record(store: ArtifactStore, suite: str, model: ResolvedModel, data: ArtifactRef):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        lineage.log_eval(run_id, model.model_id, data, metrics_of(m.stats), dataset_name=data.name)
        lineage.tag(run_id, {T.MODEL_ID: model.model_id, T.SUITE: suite, T.MODEL_DIGEST: model.ref.digest})
        if m.stats.get("skipped"):
            lineage.tag(run_id, {T.SUITE_SKIPPED: str(m.stats["skipped"])[:5000]})
        if m.stats.get("unsafe_no_sandbox"):
            lineage.tag(run_id, {T.UNSAFE_NO_SANDBOX: "true"})
        ran_on = {T.eval_setting(k): str(m.stats[k]) for k in suites.get(suite).run_tags if k in m.stats}
        if ran_on:  # a measurement of the machine too: say which, on the run
            lineage.tag(run_id, ran_on)
        if m.stats.get("sandbox"):
            lineage.tag(run_id, {T.sandbox(k): v for k, v in m.stats["sandbox"].items()})
        rows = store.local_path(store.ref(m.stage, m.name, m.digest)) / suites.rows_file(suite)
        lineage.log_artifact(run_id, rows, "rows")
        return {"model_id": model.model_id}
    return record


@stage_task("evaluate", task_run_name="evaluate-{plan.name}")
def evaluate_suite_task(plan: StagePlan, ctx: RunContext, cfg: EvalConfig, model: ResolvedModel) -> StageResult:
    logger = get_run_logger()
    store = ctx.store()
    suite = plan.name
    samples_file = plan.inputs["samples"].uri if "samples" in plan.inputs else None

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        started = time.perf_counter()
        progress.sink().stage(STAGE, f"{suite}: {model.ref.uri}")
        rows, summary = suites.get(suite).run(_suite_run(store, plan, cfg, model, w))
        rows.write_parquet(w.path(suites.rows_file(suite)))
        if summary.get("skipped"):
            logger.info("evaluate %s: skipped (%s)", suite, summary["skipped"])
        else:
            logger.info("evaluate %s: %s", suite, metrics_of(summary))
        metrics.get().eval_suite_wall_seconds.labels(suite).set(time.perf_counter() - started)
        return w.finish({**summary, "suite": suite, "model_id": model.model_id})

    import torch  # here, not at the top: a no-change rerun only plans and skips, and torch takes seconds to load

    data = logged_dataset(plan.input("data"))
    gpus = 1 if torch.cuda.is_available() and not samples_file else 0  # suites.load_eval_model's device
    return run_stage(ctx, plan, produce, _record(store, suite, model, data), _summary, gpus=gpus,
                     system_metrics=True)


def _suite_run(store: ArtifactStore, plan: StagePlan, cfg: EvalConfig, model: ResolvedModel,
               w: ArtifactWriter) -> SuiteRun:
    data = plan.input("data")
    run = SuiteRun(cfg=cfg, hf_dir=Path(model.hf_dir), path=w.path,
                   samples_file=plan.inputs["samples"].uri if "samples" in plan.inputs else None, planned=plan.config)
    run.inputs = {name: store.local_path(ref) for name, ref in plan.inputs.items()
                  if name != "model" and store.is_committed(ref)}  # the store's artifacts, not external files
    if data.stage == CORPUS_STAGE:  # a val suite: the corpus, whose split unit clusters its files
        run.corpus_dir = run.inputs["data"]
        run.split_unit = store.read_manifest(data).config.get("split_unit", "repository")
    return run


def load_rows(ctx: RunContext, result: StageResult) -> Any:
    import polars as pl

    return pl.read_parquet(ctx.store().local_path(result.ref) / suites.rows_file(result.ref.name))
