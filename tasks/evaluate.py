"""Prefect task of the evaluate stage: one content-addressed artifact per (suite, model, data, config)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger

from codemill import metrics, progress
from codemill import tags as T
from codemill.config import EvalConfig
from codemill.data.corpus import split_key
from codemill.evals import humaneval as he
from codemill.evals import suites
from codemill.hashing import sha256_file
from codemill.lineage import Lineage
from codemill.plan import StagePlan, file_input
from codemill.store import ArtifactRef, ArtifactStore, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task
from codemill.tasks.resolve_model import ResolvedModel

STAGE = "evaluate"
SUMMARY_KEYS = ("val_bpb", "completion_exact_match", "completion_edit_similarity", "humaneval_pass_at_1",
                "humaneval_sampled_pass_at_")


def val_dataset(corpus: ArtifactRef) -> ArtifactRef:
    """The val split, as a dataset: identified by the corpus digest it is a deterministic part of."""
    return ArtifactRef(stage=corpus.stage, name="corpus-val", digest=corpus.digest, uri=f"{corpus.uri}/val")


def humaneval_dataset() -> ArtifactRef:
    path = he.problems_file()
    return ArtifactRef(stage="benchmark", name="humaneval", digest=sha256_file(path), uri=str(path))


def suite_data(suite: str, corpus: ArtifactRef | None) -> ArtifactRef:
    """What a suite reads: HumanEval's problems file, or the corpus (whose val split the text suites score)."""
    if suite == "humaneval":
        return humaneval_dataset()
    if corpus is None:
        raise ValueError(f"suite {suite!r} needs a corpus (its val split)")
    return corpus


def logged_dataset(suite: str, data: ArtifactRef) -> ArtifactRef:
    """The dataset the MLflow record names: the val split for the text suites, HumanEval as it is."""
    return data if suite == "humaneval" else val_dataset(data)


def plan_suite(suite: str, cfg: EvalConfig, model: ArtifactRef, corpus: ArtifactRef | None,
               samples_file: str | None = None) -> StagePlan:
    """Digest over this suite's config (not the suite list), the model, the data, and (when scoring a samples
    file) its content: evaluations of one suite pair whenever these agree, whatever else ran beside them."""
    config = {"suite": getattr(cfg, suite).digest_config(), "bootstrap_samples": cfg.bootstrap_samples,
              "confidence": cfg.confidence, "seed": cfg.seed}
    inputs = {"model": model, "data": suite_data(suite, corpus)}
    if samples_file:
        inputs["samples"] = file_input("samples", samples_file)
    return StagePlan(stage=STAGE, name=suite, code_version=suites.SUITE_VERSIONS[suite], config=config,
                     inputs=inputs)


def metrics_of(stats: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in stats.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and k.startswith(SUMMARY_KEYS)}


def _summary(m: Manifest) -> dict[str, Any]:
    return {"suite": m.stats["suite"], "model_id": m.stats["model_id"], **metrics_of(m.stats)}


def _record(store: ArtifactStore, suite: str, model: ResolvedModel, data: ArtifactRef):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        lineage.log_eval(run_id, model.model_id, data, metrics_of(m.stats), dataset_name=data.name)
        lineage.tag(run_id, {T.MODEL_ID: model.model_id, T.SUITE: suite, T.MODEL_DIGEST: model.ref.digest})
        if suite == "humaneval" and m.stats.get("unsafe_no_sandbox"):
            lineage.tag(run_id, {T.UNSAFE_NO_SANDBOX: "true"})
        if m.stats.get("sandbox"):
            lineage.tag(run_id, {T.sandbox(k): v for k, v in m.stats["sandbox"].items()})
        rows = store.local_path(store.ref(m.stage, m.name, m.digest)) / suites.rows_file(suite)
        lineage.log_artifact(run_id, rows, "rows")
        return {"model_id": model.model_id}
    return record


def _clusters(store: ArtifactStore, corpus: ArtifactRef, val) -> list[str]:
    unit = store.read_manifest(corpus).config.get("split_unit", "repository")
    return [split_key(r, p, unit) for r, p in zip(val["repo"], val["path"], strict=True)]


@stage_task("evaluate", task_run_name="evaluate-{plan.name}")
def evaluate_suite_task(plan: StagePlan, ctx: RunContext, cfg: EvalConfig, model: ResolvedModel) -> StageResult:
    logger = get_run_logger()
    store = ctx.store()
    suite = plan.name
    samples_file = plan.inputs["samples"].uri if "samples" in plan.inputs else None

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        started = time.perf_counter()
        progress.sink().stage(STAGE, f"{suite}: {model.ref.uri}")
        if suite == "humaneval":
            rows, summary = _humaneval(w, cfg, model, samples_file)
        else:
            corpus = plan.input("data")
            val = suites.load_val_files(store.local_path(corpus), getattr(cfg, suite).max_files)
            clusters = _clusters(store, corpus, val)
            m = suites.load_eval_model(Path(model.hf_dir))
            run = suites.run_bpb if suite == "bpb" else suites.run_completion
            rows, summary = run(m, val, clusters, cfg)
        rows.write_parquet(w.path(suites.rows_file(suite)))
        logger.info("evaluate %s: %s", suite, metrics_of(summary))
        metrics.get().eval_suite_wall_seconds.labels(suite).set(time.perf_counter() - started)
        return w.finish({**summary, "suite": suite, "model_id": model.model_id})

    import torch  # here, not at the top: a no-change rerun only plans and skips, and torch takes seconds to load

    data = logged_dataset(suite, plan.input("data"))
    gpus = 1 if torch.cuda.is_available() and not samples_file else 0  # suites.load_eval_model's device
    return run_stage(ctx, plan, produce, _record(store, suite, model, data), _summary, gpus=gpus,
                     system_metrics=True)


def _humaneval(w: ArtifactWriter, cfg: EvalConfig, model: ResolvedModel, samples_file: str | None):
    problems = he.load_problems()
    if cfg.humaneval.max_problems:
        problems = dict(list(problems.items())[: cfg.humaneval.max_problems])
    with suites.humaneval_pool(cfg) as pool:  # probes first: fail closed before generating anything
        if samples_file:
            samples = [{**s, "mode": "greedy"} for s in he.read_samples(samples_file)]
        else:
            samples = suites.humaneval_samples(suites.load_eval_model(Path(model.hf_dir)), problems, cfg)
        he.write_samples(w.path("samples.jsonl"), samples)
        return suites.score_humaneval(samples, problems, cfg, pool)


def load_rows(ctx: RunContext, result: StageResult) -> Any:
    import polars as pl

    return pl.read_parquet(ctx.store().local_path(result.ref) / suites.rows_file(result.ref.name))
