"""The MLflow tracking server goes away mid-run: the flow retries its server-facing stage and completes once
the server is back (same port, same database), training is not killed, and nothing in the store is half-written.
A server that is down at flow start fails the flow at once, naming its URI."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from codemill.store import ArtifactStore
from tests.conftest import MlflowServer, free_port
from tests.integration.helpers import small_pipeline_config
from tests.integration.store_checks import committed_artifacts

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]


def _wait_for(pattern: str, root: Path, stop: threading.Event) -> bool:
    while not stop.is_set():
        if list(root.glob(pattern)):
            return True
        time.sleep(0.2)
    return False


def _outage(server: MlflowServer, store: Path, stop: threading.Event, log: list[str]) -> None:
    """Stop the server as torchrun starts (the train spec is written), restart it once the checkpoint is
    committed: the train task's logging after the commit meets a dead server, whatever the machine's speed."""
    if not _wait_for("train/*.spec.json", store, stop):
        return
    server.stop()
    log.append("stopped")
    if not _wait_for("train/*/manifest.json", store, stop):
        return
    time.sleep(3)
    server.start()
    log.append("restarted")


def test_flow_retries_through_a_tracking_server_restart(small_corpus, tmp_path, mlflow_server, monkeypatch):
    from codemill.flows.pipeline import pipeline

    for k, v in {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}.items():
        monkeypatch.setenv(k, v)  # fail over to Prefect's stage retries quickly
    cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=5)
    cfg.mlflow_tracking_uri = mlflow_server.uri
    cfg.train.checkpoint_every = 3
    cfg.evaluate.suites = ["bpb"]
    cfg.gate.enabled = False
    store_dir, stop, events = Path(cfg.store_root), threading.Event(), []
    watcher = threading.Thread(target=_outage, args=(mlflow_server, store_dir, stop, events), daemon=True)
    watcher.start()
    try:
        out = pipeline(config=cfg)
    finally:
        stop.set()
        watcher.join(timeout=120)
    assert events == ["stopped", "restarted"]

    # the train task failed on the dead server after committing, was retried, and found its artifact
    assert out["stages"]["train"]["status"] == "present"
    client = MlflowClient(mlflow_server.uri)
    train_runs = client.search_runs([out["experiment_id"]], "tags.`codemill.stage` = 'train'")
    statuses = sorted(r.info.status for r in train_runs)
    assert statuses == ["FINISHED", "RUNNING"], statuses  # the first attempt could not even record its end
    retried = client.get_run(out["stages"]["train"]["run_id"])
    assert retried.data.tags["codemill.reregistered"] == "true"

    # training ran to the end although rank 0 could not log; the model and its eval are in MLflow
    store = ArtifactStore(cfg.store_root, cache_dir=tmp_path / "check-cache")
    found = committed_artifacts(store)
    assert found["train/model"].stats["steps"] == cfg.train.max_steps
    assert {"ingest/corpus", "tokenize/tokens", "train/model"} <= set(found)
    assert not list(store_dir.rglob(".staging-*")), "staging directories left behind"
    model = client.get_logged_model(out["model_id"])
    assert model.source_run_id == retried.info.run_id
    assert [m for m in model.metrics if m.key == "val_bpb"]
    assert store.is_committed(store.ref("train", "model", found["train/model"].digest))


def test_dead_tracking_server_fails_fast_naming_it(small_corpus, tmp_path):
    from codemill.flows.pipeline import pipeline

    cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=5)
    cfg.mlflow_tracking_uri = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=f"MLflow tracking server {cfg.mlflow_tracking_uri} is unreachable"):
        pipeline(config=cfg)
    assert time.monotonic() - t0 < 60
    assert not list(Path(cfg.store_root).rglob("manifest.json"))
