"""The ``evaluate`` flow: any model (LoggedModel id, store checkpoint, HF folder) on the chosen suites, and
the gate against the champion that the pipeline and nightly flows share."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.evals.suites import SUITE_OF_METRIC
from codemill.flows.common import (
    close_live_vllm,
    eval_results,
    execute,
    flow_result,
    flow_run_metrics,
    flow_run_url,
    open_flow_run,
)
from codemill.flows.hooks import record_failure_on_mlflow
from codemill.flows.plan import config_recipe, plan_evaluations
from codemill.gate.calibration import noise_source, recipe_key
from codemill.gate.evidence import NoiseSource
from codemill.lineage import Registry
from codemill.lineage import tags as T
from codemill.lineage.check import absolute_tracking_uri
from codemill.store import MANIFEST, ArtifactRef, ArtifactStore, Manifest
from codemill.tasks.common import RunContext, StageResult, claimed
from codemill.tasks.gate import gate_task
from codemill.tasks.resolve_model import ResolvedModel, resolve_model


def latest_corpus(store: ArtifactStore) -> ArtifactRef | None:
    refs = store.list("ingest")
    return max(refs, key=lambda r: store.read_manifest(r).created_at) if refs else None


def corpus_ref(store: ArtifactStore, corpus: str | None) -> ArtifactRef | None:
    """A corpus artifact folder (or URI) in the store; empty = the newest committed one."""
    if not corpus:
        return latest_corpus(store)
    with store.fs.open(f"{corpus.rstrip('/')}/{MANIFEST}", "r") as fh:
        m = Manifest.model_validate_json(fh.read())
    if m.stage != "ingest":
        raise ValueError(f"{corpus} is a {m.stage} artifact, not a corpus")
    return store.ref(m.stage, m.name, m.digest)


def evaluate_resolved(ctx: RunContext, store: ArtifactStore, config: PipelineConfig, model: ResolvedModel,
                      corpus: ArtifactRef | None, samples_file: str | None = None) -> dict[str, StageResult]:
    """The configured suites on a model whose LoggedModel and folder are known: suite -> result."""
    steps = plan_evaluations(config, model.ref, corpus, samples_file, resolved=model, store=store)
    return eval_results(execute(steps, ctx, store))


def calibratable(config: PipelineConfig, champion_dir: str) -> list[str]:
    """The recipe keys ``codemill calibrate`` can measure with this config: as it is, from scratch (the nightly
    flow sets ``init_from`` at run time) and ``--from-champion``."""
    train = config.train
    return [recipe_key(config_recipe(config.model_copy(update={"train": train.model_copy(update=u)})))
            for u in ({}, {"init_from": None}, {"init_from": champion_dir})]


def gate_against_champion(ctx: RunContext, store: ArtifactStore, config: PipelineConfig, model: ResolvedModel,
                          corpus: ArtifactRef | None, evals: dict[str, StageResult],
                          seed_evals: dict[int, dict[str, StageResult]] | None = None) -> dict[str, Any] | None:
    """Evaluate the champion on the same suites and data (cached when it was before), then gate, with the
    seed noise of the champion's recipe when ``codemill calibrate`` measured it or a preset of that recipe ships
    it (``gate.calibration.noise_source``)."""
    if not config.gate.enabled:
        return None
    name = config.gate.registered_model or config.name
    # One gate at a time per registered model: two runs gating the same candidate at once would each find no
    # champion (or the old one) and register it twice. The second finds the first's verdict in the registry.
    with claimed(ctx, store, "gate", registry_key(name, ctx.tracking_uri)):
        return _gate(ctx, store, config, name, model, corpus, evals, seed_evals)


def registry_key(name: str, tracking_uri: str) -> str:
    """The gate's claim key for one registered model on one tracking server (a name safe as a file name)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return f"{safe}-{hashlib.sha256(absolute_tracking_uri(tracking_uri).encode()).hexdigest()[:12]}"


def _gate(ctx: RunContext, store: ArtifactStore, config: PipelineConfig, name: str, model: ResolvedModel,
          corpus: ArtifactRef | None, evals: dict[str, StageResult],
          seed_evals: dict[int, dict[str, StageResult]] | None) -> dict[str, Any]:
    champion = Registry(ctx.lineage(), name, config.gate.alias).champion()
    champion_evals = None
    noise: NoiseSource | None = None
    if champion and champion.get(T.MODEL_ID) != model.model_id:
        champ_model = resolve_model(ctx, champion[T.MODEL_ID])
        champion_evals = evaluate_resolved(ctx, store, config, champ_model, corpus)
        gated = [m.name for m in config.gate.metrics if SUITE_OF_METRIC.get(m.name, "") in evals
                 or m.name not in SUITE_OF_METRIC]  # the metrics of suites that ran
        noise = noise_source(store, champ_model.ref.digest, config.evaluate.digest_config(), gated,
                             calibratable(config, champ_model.hf_dir))
    return gate_task(ctx=ctx, cfg=config.gate, registered_model=name, candidate=model, candidate_evals=evals,
                     champion=champion, champion_evals=champion_evals, noise=noise,
                     candidate_seed_evals=seed_evals)


def _run_name() -> str:
    return f"evaluate-{flow_run.parameters.get('model', 'model')[:40]}-{datetime.now(UTC):%Y%m%d-%H%M%S}"


@flow(name="evaluate", flow_run_name=_run_name, persist_result=True, log_prints=True,
      on_failure=[record_failure_on_mlflow], on_crashed=[record_failure_on_mlflow])
def evaluate(model: str, config: PipelineConfig = PipelineConfig(), corpus: str | None = None,  # noqa: B008
             samples_file: str | None = None) -> dict[str, Any]:
    """Evaluate ``model`` on ``config.evaluate.suites``; gate it against the champion when ``config.gate``
    is enabled. ``samples_file`` scores a HumanEval samples JSONL instead of generating."""
    try:
        with flow_run_metrics(config, "evaluate"):
            return _evaluate(model, config, corpus, samples_file)
    finally:
        close_live_vllm()  # the suites' vLLM engine (evaluate.engine vllm): its memory back for what follows


def _evaluate(model: str, config: PipelineConfig, corpus: str | None, samples_file: str | None) -> dict[str, Any]:
    store, ctx, lineage, parent = open_flow_run(config, flow_run.name or "evaluate", flow_run.id, flow_run_url())
    try:
        resolved = resolve_model(ctx, model)
        data = corpus_ref(store, corpus)
        evals = evaluate_resolved(ctx, store, config, resolved, data, samples_file)
        verdict = gate_against_champion(ctx, store, config, resolved, data, evals)
    except BaseException:
        lineage.end_run(parent, failed=True)
        raise
    lineage.tag(parent, {T.MODEL_ID: resolved.model_id, T.MODEL_DIGEST: resolved.ref.digest})
    return flow_result(lineage, parent, config, {f"eval:{k}": v for k, v in evals.items()}, resolved.model_id,
                       verdict)
