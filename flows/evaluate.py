"""The ``evaluate`` flow: any model (LoggedModel id, store checkpoint, HF folder) on the chosen suites."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from codemill.config import PipelineConfig
from codemill.flows.common import flow_run_url, open_flow_run
from codemill.flows.evaluation import evaluate_model, gate_against_champion, scores_of
from codemill.flows.hooks import record_failure_on_mlflow
from codemill.store import MANIFEST, ArtifactRef, ArtifactStore, Manifest
from codemill.tasks.models import resolve_model


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


def _run_name() -> str:
    return f"evaluate-{flow_run.parameters.get('model', 'model')[:40]}-{datetime.now(UTC):%Y%m%d-%H%M%S}"


@flow(name="evaluate", flow_run_name=_run_name, persist_result=True, log_prints=True,
      on_failure=[record_failure_on_mlflow], on_crashed=[record_failure_on_mlflow])
def evaluate(model: str, config: PipelineConfig = PipelineConfig(), corpus: str | None = None,  # noqa: B008
             samples_file: str | None = None) -> dict[str, Any]:
    """Evaluate ``model`` on ``config.evaluate.suites``; gate it against the champion when ``config.gate``
    is enabled. ``samples_file`` scores a HumanEval samples JSONL instead of generating."""
    store, ctx, lineage = open_flow_run(config, flow_run.name or "evaluate", flow_run.id, flow_run_url())
    parent = ctx.parent_run_id
    try:
        resolved = resolve_model(ctx, model)
        data = corpus_ref(store, corpus)
        evals = evaluate_model(ctx, store, config, resolved, data, samples_file)
        verdict = gate_against_champion(ctx, store, config, resolved, data, evals)
    except BaseException:
        lineage.end_run(parent, failed=True)
        raise
    scores = scores_of(evals)
    lineage.log_metrics(parent, scores)
    lineage.tag(parent, {"codemill.model_id": resolved.model_id, "codemill.model_digest": resolved.ref.digest})
    lineage.end_run(parent)
    return {"parent_run_id": parent, "experiment_id": lineage.experiment_id,
            "tracking_uri": config.mlflow_tracking_uri, "flow_run_id": str(flow_run.id) if flow_run.id else None,
            "model_id": resolved.model_id, "scores": scores, "gate": verdict,
            "stages": {f"eval:{k}": v.model_dump(mode="json") for k, v in evals.items()}}
