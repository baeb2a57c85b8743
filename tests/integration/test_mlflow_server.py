"""The pipeline against real servers: an ``mlflow server`` subprocess (SQLite, proxied artifacts) that the flow
and rank 0 of 2 torchrun ranks log to over HTTP, and a store on S3 (the moto server, through s3fs), where every
artifact is whole and a rerun finds every stage in the cache."""

from __future__ import annotations

import json
import urllib.request

import pytest
from mlflow import MlflowClient

from codemill.lineage import mlflow_digest
from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config
from tests.integration.store_checks import committed_artifacts, staging_leftovers, use_s3

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]


def test_pipeline_logs_over_http_and_stores_on_s3(small_corpus, tmp_path, s3_endpoint, mlflow_server, monkeypatch):
    from codemill.flows.pipeline import pipeline

    cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=5)
    cfg.store_root = use_s3(monkeypatch, s3_endpoint, "codemill-mlflow-server")
    cfg.mlflow_tracking_uri = mlflow_server.uri
    cfg.train.checkpoint_every = 3  # one mid-run checkpoint, logged by rank 0 over HTTP
    cfg.evaluate.suites = ["bpb"]
    cfg.gate.enabled = False
    out = pipeline(config=cfg)

    # every stage ran and its artifact is whole on S3 (bytes read back through s3fs), nothing left staged
    assert {k: v["status"] for k, v in out["stages"].items()} == dict.fromkeys(out["stages"], "ran")
    st = {k: ArtifactRef.model_validate(v["ref"]) for k, v in out["stages"].items()}
    store = ArtifactStore(cfg.store_root, cache_dir=tmp_path / "check-cache")
    found = committed_artifacts(store)
    for ref in st.values():
        assert ref.uri.startswith("s3://codemill-mlflow-server/store/")
        assert found[f"{ref.stage}/{ref.name}"].digest == ref.digest
    assert staging_leftovers(cfg.work_dir) == []

    # the lineage chain, read over HTTP: eval metric -> LoggedModel -> train run -> tokens -> corpus -> source
    client = MlflowClient(mlflow_server.uri)
    model = client.get_logged_model(out["model_id"])
    eval_run_id = out["stages"]["eval:bpb"]["run_id"]
    (metric,) = [m for m in model.metrics if m.key == "val_bpb" and m.run_id == eval_run_id]
    assert metric.value == pytest.approx(out["scores"]["val_bpb"])
    assert metric.dataset_digest == mlflow_digest(st["ingest"].digest)
    train_run = client.get_run(model.source_run_id)
    assert train_run.info.run_id == out["stages"]["train"]["run_id"]
    assert train_run.data.metrics["train_loss"] > 0  # step metrics from torchrun rank 0
    ckpts = client.search_logged_models([out["experiment_id"]],
                                        filter_string=f"source_run_id = '{train_run.info.run_id}'")
    assert sorted(m.tags.get("codemill.step") for m in ckpts if "codemill.step" in m.tags) == ["3"]
    (tokens_in,) = [d for d in train_run.inputs.dataset_inputs if d.dataset.name == "tokens"]
    assert json.loads(tokens_in.dataset.source)["uri"] == st["tokenize"].uri
    tok_run = client.get_run(out["stages"]["tokenize"]["run_id"])
    assert tok_run.data.tags["codemill.output_digest"] == st["tokenize"].digest
    (corpus_in,) = [d for d in tok_run.inputs.dataset_inputs if d.dataset.name == "corpus"]
    assert corpus_in.dataset.digest == mlflow_digest(st["ingest"].digest)
    ing_run = client.get_run(out["stages"]["ingest"]["run_id"])
    assert ing_run.data.tags["codemill.source.0.root"] == str(small_corpus)

    # MLflow artifacts go through the server's proxy (mlflow-artifacts:/) into its artifacts destination
    assert ing_run.info.artifact_uri.startswith("mlflow-artifacts:")
    url = (f"{mlflow_server.uri}/api/2.0/mlflow-artifacts/artifacts/"
           f"{ing_run.info.artifact_uri.split('mlflow-artifacts:/', 1)[1].lstrip('/')}/ingest_counts.json")
    with urllib.request.urlopen(url, timeout=30) as r:
        table = json.loads(r.read())
    assert table["columns"] and table["data"], table
    names = {a.path for a in client.list_logged_model_artifacts(model.model_id)}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= names
    assert list((mlflow_server.root / "artifacts").rglob("model.safetensors"))

    # the same config again: every stage is a cache hit on its artifact digest in the S3 store
    again = pipeline(config=cfg)
    assert {k: v["status"] for k, v in again["stages"].items()} == dict.fromkeys(out["stages"], "cached")
