"""deployments/prefect.yaml served by `codemill serve`, a run triggered through the API as the UI does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from codemill.models.launch import kill_group
from codemill.store import ArtifactStore
from tests.integration.helpers import small_pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]


def _wait_for_deployment(name: str, proc: subprocess.Popen, log: Path, timeout: float = 180):
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"codemill serve exited early:\n{log.read_text()[-4000:]}"
            try:
                return client.read_deployment_by_name(name)
            except ObjectNotFound:
                time.sleep(1)
    raise AssertionError(f"deployment {name} never registered:\n{log.read_text()[-4000:]}")


def test_serve_registers_schedule_and_runs_a_triggered_deployment(small_corpus, tmp_path):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    from codemill.lineage import Lineage

    log = tmp_path / "serve.log"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "codemill.cli", "serve", "--timezone", "Europe/Berlin"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        nightly = _wait_for_deployment("nightly/nightly", proc, log)
        crons = [(s.schedule.cron, s.schedule.timezone) for s in nightly.schedules]
        assert crons == [("0 2 * * *", "Europe/Berlin")]
        assert nightly.global_concurrency_limit is not None and nightly.global_concurrency_limit.limit == 1
        assert "config" in nightly.parameter_openapi_schema["properties"]
        for name in ("pipeline/pipeline", "pipeline/ingest", "pipeline/tokenize", "pipeline/train",
                     "evaluate/evaluate", "problems/problems", "rl/rl"):
            _wait_for_deployment(name, proc, log)

        cfg = small_pipeline_config(small_corpus, tmp_path)
        cfg.name = "ui-triggered"
        cfg.ingest.near_dedup.threshold = 0.85  # a non-default parameter, as typed into the UI form
        run = run_deployment("pipeline/ingest", parameters={"config": cfg.model_dump(mode="json")}, timeout=400)
        assert run.state.is_completed(), f"{run.state}\n{log.read_text()[-4000:]}"
        assert run.name.startswith("ui-triggered-pipeline-until-ingest-s"), run.name
        assert {"codemill", "stage", "flow:pipeline", "experiment:ui-triggered", "until:ingest"} <= set(run.tags)

        corpus = ArtifactStore(cfg.store_root).list("ingest")
        assert len(corpus) == 1
        stats = ArtifactStore(cfg.store_root).read_manifest(corpus[0])
        assert stats.config["near_dedup"]["threshold"] == 0.85
        with get_client(sync_client=True) as client:
            keys = {a.key for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))}
        assert {"ingest-stats", "mlflow-run"} <= keys
        lineage = Lineage(cfg.mlflow_tracking_uri, cfg.name)
        parents = lineage.flow_runs(str(run.id))
        assert [lineage.client.get_run(p).info.status for p in parents] == ["FINISHED"]
    finally:
        kill_group(proc, signal.SIGINT, grace_s=30)  # SIGINT: serve shuts down and pauses its schedules


def test_failed_flow_run_is_recorded_on_its_mlflow_run(small_corpus, tmp_path):
    from codemill.data.sources import FolderSource
    from codemill.flows.pipeline import pipeline
    from codemill.lineage import Lineage

    cfg = small_pipeline_config(small_corpus, tmp_path)
    cfg.ingest.sources = [FolderSource(path=str(tmp_path / "does-not-exist"))]
    state = pipeline(config=cfg, until="ingest", return_state=True)
    assert state.is_failed()
    lineage = Lineage(cfg.mlflow_tracking_uri, cfg.name)
    (run,) = lineage.client.search_runs([lineage.experiment_id], filter_string="tags.`codemill.stage` = 'pipeline'")
    assert run.info.status == "FAILED"
    assert "does-not-exist" in run.data.tags["codemill.failure"]
