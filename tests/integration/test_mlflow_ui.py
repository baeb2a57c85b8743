"""The MLflow UI, served by a real `mlflow server` on the test run's SQLite DB, opened in headless Chromium:
the experiment's Models tab lists the pipeline's model; its page shows the eval metric and its dataset digest."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from codemill.lineage import mlflow_digest
from tests.conftest import MlflowServer

pytestmark = pytest.mark.integration
REPO_ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture
def ui_server(lineage_runs):
    server = MlflowServer(lineage_runs["tmp"]).start()  # serves <tmp>/mlflow.db, the pipeline's tracking DB
    yield server
    server.stop()


@pytest.mark.system_tool("chromium")
def test_model_page_shows_dataset_digest_and_eval_metric(lineage_runs, ui_server, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    first = lineage_runs["first"]
    model_id, experiment_id = first["model_id"], first["experiment_id"]
    digest = mlflow_digest(first["stages"]["ingest"]["ref"]["digest"])
    bpb = first["scores"]["val_bpb"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            page.set_default_timeout(60_000)
            page.goto(f"{ui_server.uri}/#/experiments/{experiment_id}/models")
            name = f"model-{first['stages']['train']['ref']['digest'][:12]}"  # the LoggedModel's name
            page.get_by_text(name, exact=True).click()
            expect(page).to_have_url(f"{ui_server.uri}/#/experiments/{experiment_id}/models/{model_id}")
            # the metrics table: one row per metric, "<dataset name> (#<digest>)", source run, value
            row = page.get_by_role("row").filter(has=page.get_by_text("val_bpb", exact=True))
            expect(row).to_contain_text(f"corpus-val (#{digest})")
            expect(row).to_contain_text(str(bpb))  # JS and Python print a float's shortest round-trip form
            expect(page.locator("body")).to_contain_text(model_id)
            shot = tmp_path / "mlflow-model.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    REPO_ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, REPO_ARTIFACTS / "mlflow-model.png")
