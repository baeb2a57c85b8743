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
from codemill.flows.common import eval_results
from codemill.flows.hooks import record_failure_on_mlflow
from codemill.flows.plan import GatePlan, plan_evaluations, plan_gate
from codemill.flows.run import FlowRun, open_run
from codemill.gate.calibration import noise_source
from codemill.gate.evidence import NoiseSource
from codemill.lineage import Registry
from codemill.lineage import tags as T
from codemill.lineage.check import absolute_tracking_uri
from codemill.store import MANIFEST, ArtifactRef, ArtifactStore, Manifest
from codemill.tasks.common import StageResult, claimed
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


def gate_against_champion(run: FlowRun, gate: GatePlan, model: ResolvedModel, corpus: ArtifactRef | None,
                          evals: dict[str, StageResult],
                          seed_evals: dict[int, dict[str, StageResult]] | None = None) -> dict[str, Any]:
    """Evaluate the champion on the same suites and data (cached when it was before), then gate, with the
    seed noise of the champion's recipe when ``codemill calibrate`` measured it or a preset of that recipe ships
    it (``gate.calibration.noise_source``)."""
    # One gate at a time per registered model: two runs gating the same candidate at once would each find no
    # champion (or the old one) and register it twice. The second finds the first's verdict in the registry.
    key = registry_key(gate.registered_model, run.ctx.tracking_uri)
    with claimed(run.ctx, run.store, "gate", key):
        champion = Registry(run.lineage, gate.registered_model, gate.settings.alias).champion()
        champion_evals = None
        noise: NoiseSource | None = None
        if champion and champion.get(T.MODEL_ID) != model.model_id:
            champ_model = resolve_model(run.ctx, champion[T.MODEL_ID])
            recipes = gate.calibratable(champ_model.hf_dir)
            steps = gate.evaluations.steps(champ_model.ref, corpus, resolved=champ_model)
            champion_evals = eval_results(run.execute(steps))
            gated = [m.name for m in gate.settings.metrics if SUITE_OF_METRIC.get(m.name, "") in evals
                     or m.name not in SUITE_OF_METRIC]  # the metrics of suites that ran
            noise = noise_source(run.store, champ_model.ref.digest, gate.suite_digests, gated, recipes)
        return gate_task(ctx=run.ctx, cfg=gate.settings, registered_model=gate.registered_model, candidate=model,
                         candidate_evals=evals, champion=champion, champion_evals=champion_evals, noise=noise,
                         candidate_seed_evals=seed_evals)


def registry_key(name: str, tracking_uri: str) -> str:
    """The gate's claim key for one registered model on one tracking server (a name safe as a file name)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return f"{safe}-{hashlib.sha256(absolute_tracking_uri(tracking_uri).encode()).hexdigest()[:12]}"


def _run_name() -> str:
    return f"evaluate-{flow_run.parameters.get('model', 'model')[:40]}-{datetime.now(UTC):%Y%m%d-%H%M%S}"


@flow(name="evaluate", flow_run_name=_run_name, persist_result=True, log_prints=True,
      on_failure=[record_failure_on_mlflow], on_crashed=[record_failure_on_mlflow])
def evaluate(model: str, config: PipelineConfig = PipelineConfig(), corpus: str | None = None,  # noqa: B008
             samples_file: str | None = None) -> dict[str, Any]:
    """Evaluate ``model`` on ``config.evaluate.suites``; gate it against the champion when ``config.gate``
    is enabled. ``samples_file`` scores a HumanEval samples JSONL instead of generating."""
    with open_run(config, "evaluate", tag=False) as run:
        resolved = resolve_model(run.ctx, model)
        data = corpus_ref(run.store, corpus)
        evaluations = plan_evaluations(config, run.store)
        evals = eval_results(run.execute(evaluations.steps(resolved.ref, data, samples_file, resolved=resolved)))
        gate = plan_gate(config, evaluations)
        verdict = gate_against_champion(run, gate, resolved, data, evals) if gate is not None else None
        run.lineage.tag(run.parent, {T.MODEL_ID: resolved.model_id, T.MODEL_DIGEST: resolved.ref.digest})
        return run.finish({f"eval:{k}": v for k, v in evals.items()}, resolved.model_id, verdict)
