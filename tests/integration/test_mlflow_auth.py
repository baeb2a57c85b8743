"""Who may move the champion: the pipeline against a real ``mlflow server --app-name basic-auth`` subprocess
(SQLite tracking store and auth DB), its identities created by ``codemill mlflow-identities`` as the admin.

The pipeline identity runs the flow end to end (runs, LoggedModels from torchrun rank 0, the version, the alias);
an anonymous client is refused with 401 and the reader with 403 when they log, register or move the alias, while
the reader can still run ``codemill lineage``; a wrong password fails the flow at start, before any stage."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from typer.testing import CliRunner

from codemill.cli import app
from codemill.lineage import Lineage, Registry, TrackingAccessDenied, guarded_client
from tests.conftest import MlflowServer
from tests.integration.helpers import chain_config, small_pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]

EXPERIMENT = "codemill-auth"
ADMIN = ("admin", "admin-password-0123")
PIPELINE = ("pipeline", "pipeline-password-4567")
READER = ("reader", "reader-password-89ab")
CRED_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


class AuthMlflowServer(MlflowServer):
    """``mlflow server --app-name basic-auth``: auth DB in SQLite here (PostgreSQL in deployments/mlflow/),
    nobody may do anything by default (``default_permission = NO_PERMISSIONS``) and a successful password check
    is cached for a minute, as in the cluster's ConfigMap."""

    def app_args(self) -> list[str]:
        return ["--app-name", "basic-auth"]

    def environment(self) -> dict[str, str]:
        self.root.mkdir(parents=True, exist_ok=True)
        ini = self.root / "basic_auth.ini"
        ini.write_text("[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
                       f"database_uri = sqlite:///{self.root / 'auth.db'}\nadmin_username = {ADMIN[0]}\n"
                       "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                       "auth_cache_ttl_seconds = 60\n")
        env = {k: v for k, v in os.environ.items() if k not in CRED_VARS}
        return env | {"MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN[1],
                      "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-only-csrf-key",
                      "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no GenAI job runners: a faster start


def use_identity(mp: pytest.MonkeyPatch, identity: tuple[str, str] | None) -> None:
    """Authenticate as ``identity`` through MLflow's standard variables (None: anonymous)."""
    for var in CRED_VARS:
        mp.delenv(var, raising=False)
    if identity:
        mp.setenv("MLFLOW_TRACKING_USERNAME", identity[0])
        mp.setenv("MLFLOW_TRACKING_PASSWORD", identity[1])


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory) -> Iterator[AuthMlflowServer]:
    server = AuthMlflowServer(tmp_path_factory.mktemp("mlflow-auth")).start()
    with pytest.MonkeyPatch.context() as mp:
        use_identity(mp, ADMIN)
        mp.setenv("CODEMILL_MLFLOW_PIPELINE_PASSWORD", PIPELINE[1])
        mp.setenv("CODEMILL_MLFLOW_READER_PASSWORD", READER[1])
        result = CliRunner().invoke(app, ["mlflow-identities", "--tracking-uri", server.uri,
                                          "--experiment", EXPERIMENT])
    assert result.exit_code == 0, result.output
    assert "created user pipeline" in result.output and "reader: READ on every experiment" in result.output
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pipeline_run(auth_server, tiny_corpus, tmp_path_factory):
    """One small pipeline run (ingest -> tokenize -> 3 torchrun steps -> bpb -> gate) as the pipeline identity."""
    from codemill.flows.pipeline import pipeline

    cfg = chain_config(tiny_corpus, tmp_path_factory.mktemp("auth-run"))  # one rank: its rank 0 authenticates
    cfg.name = EXPERIMENT
    cfg.mlflow_tracking_uri = auth_server.uri
    with pytest.MonkeyPatch.context() as mp:
        use_identity(mp, PIPELINE)
        out = pipeline(config=cfg)
    return cfg, out


def _client(uri: str, mp: pytest.MonkeyPatch, identity: tuple[str, str] | None) -> MlflowClient:
    use_identity(mp, identity)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def test_pipeline_identity_runs_end_to_end_and_moves_the_alias(auth_server, pipeline_run, monkeypatch):
    cfg, out = pipeline_run
    assert {k: v["status"] for k, v in out["stages"].items()} == dict.fromkeys(out["stages"], "ran")
    assert out["gate"]["verdict"] == "promote"
    client = _client(auth_server.uri, monkeypatch, READER)
    champion = client.get_model_version_by_alias(EXPERIMENT, "champion")
    assert champion.tags["codemill.model_id"] == out["model_id"]
    train_run = client.get_run(out["stages"]["train"]["run_id"])
    assert train_run.data.metrics["train_loss"] > 0  # torchrun rank 0 authenticated with the same variables


@pytest.mark.parametrize("identity, status", [(None, 401), (READER, 403)], ids=["anonymous", "reader"])
def test_anonymous_and_reader_cannot_log_register_or_move_the_alias(auth_server, pipeline_run, monkeypatch,
                                                                     identity, status):
    _, out = pipeline_run
    run_id, model_id = out["stages"]["train"]["run_id"], out["model_id"]
    versions_before = len(_client(auth_server.uri, monkeypatch, PIPELINE).search_model_versions(
        f"name = '{EXPERIMENT}'"))

    # the server's own answer: status and body
    raw = _client(auth_server.uri, monkeypatch, identity)
    body = "You are not authenticated" if status == 401 else "Permission denied"
    for attempt in (lambda: raw.log_metric(run_id, "forged", 1.0),
                    lambda: raw.create_model_version(EXPERIMENT, source="mlflow-artifacts:/x", model_id=model_id),
                    lambda: raw.set_registered_model_alias(EXPERIMENT, "champion", "1")):
        with pytest.raises(MlflowException, match=f"error code {status} != 200. Response body: '{body}") as e:
            attempt()
        assert e.value.get_http_status_code() == status

    # codemill's path (Lineage, Registry): an error naming the server, the user and the operation
    who = "an anonymous client" if identity is None else f"user {identity[0]!r}"
    verb = "refused" if status == 401 else "denied"
    if identity is None:  # refused at the first request: opening the lineage writer is already one
        client = guarded_client(auth_server.uri)
        refusals = {"search_experiments": lambda: Lineage(auth_server.uri, EXPERIMENT),
                    "log_metric": lambda: client.log_metric(run_id, "forged", 1.0),
                    "create_model_version": lambda: client.create_model_version(EXPERIMENT, source="x",
                                                                                model_id=model_id)}
    else:  # the reader gets as far as the writes: the lineage writer opens (reads), then each write fails
        lineage = Lineage(auth_server.uri, EXPERIMENT)
        client = lineage.client
        refusals = {"create_run": lambda: lineage.start_parent("forged", None, None, {}),
                    "log_batch": lambda: lineage.log_metrics(run_id, {"forged": 1.0}),
                    "create_model_version": lambda: Registry(lineage, EXPERIMENT).promote(model_id, {})}
    refusals["set_registered_model_alias"] = lambda: client.set_registered_model_alias(EXPERIMENT, "champion", "1")
    for operation, attempt in refusals.items():
        with pytest.raises(TrackingAccessDenied) as denied:
            attempt()
        err = denied.value
        assert (err.status, err.operation) == (status, operation)
        assert str(err).startswith(f"MLflow tracking server {auth_server.uri} {verb} {who}"), str(err)
        print(f"{identity and identity[0]} {operation}: {err}")

    # nothing moved: same champion, no new version
    admin = _client(auth_server.uri, monkeypatch, PIPELINE)
    assert admin.get_model_version_by_alias(EXPERIMENT, "champion").tags["codemill.model_id"] == model_id
    assert len(admin.search_model_versions(f"name = '{EXPERIMENT}'")) == versions_before


def test_reader_can_run_codemill_lineage_and_anonymous_cannot(auth_server, pipeline_run, monkeypatch):
    cfg, out = pipeline_run
    args = ["lineage", out["model_id"], "--store", cfg.store_root, "--tracking-uri", auth_server.uri]
    use_identity(monkeypatch, READER)
    shown = CliRunner().invoke(app, args, terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "val_bpb" in shown.output and out["stages"]["train"]["run_id"] in shown.output
    assert f"{EXPERIMENT}@champion" in shown.output  # the registry alias, read by the reader

    use_identity(monkeypatch, None)
    refused = CliRunner().invoke(app, args, terminal_width=400)
    assert refused.exit_code == 2, refused.output
    assert f"MLflow tracking server {auth_server.uri} refused an anonymous client" in " ".join(refused.output.split())


@pytest.mark.parametrize("identity, status", [((PIPELINE[0], "wrong-password-000"), 401), (READER, 403)],
                         ids=["wrong-password", "reader"])
def test_bad_credentials_fail_the_flow_at_start(auth_server, tiny_corpus, tmp_path, monkeypatch, identity, status):
    """Before any stage: no artifact in the store, no training launched, within seconds. (The experiment exists:
    the admin created it, so the reader cannot create one of its own to write into.)"""
    from codemill.flows.pipeline import pipeline

    cfg = small_pipeline_config(tiny_corpus, tmp_path, max_steps=3)
    cfg.name = EXPERIMENT
    cfg.mlflow_tracking_uri = auth_server.uri
    use_identity(monkeypatch, identity)
    started = time.monotonic()
    with pytest.raises(TrackingAccessDenied) as denied:
        pipeline(config=cfg)
    assert time.monotonic() - started < 30
    assert denied.value.status == status and auth_server.uri in str(denied.value)
    if status == 401:
        assert str(denied.value).startswith(f"MLflow tracking server {auth_server.uri} refused the credentials of "
                                            f"user 'pipeline'")
        assert denied.value.operation == "search_experiments"  # the preflight of Lineage, before any other call
    else:
        assert denied.value.operation == "create_run"
    print(f"{identity[0]}: {denied.value}")
    assert not Path(cfg.store_root).exists() or not any(Path(cfg.store_root).rglob("manifest.json"))
    assert not Path(cfg.work_dir).exists() or not any(Path(cfg.work_dir).rglob("*.log"))


@pytest.mark.parametrize("identity", [(PIPELINE[0], "wrong-password-000"), None], ids=["wrong-password", "anonymous"])
def test_codemill_run_with_refused_credentials_stops_in_one_line(auth_server, tmp_path, monkeypatch, identity):
    """The preflight asks the server with the run's own credentials: a refusal is an `error:` and a `hint:`
    line, exit 2, before any flow run, store write or MLflow run."""
    config = tmp_path / "auth.yaml"
    config.write_text(f"name: {EXPERIMENT}\nmlflow_tracking_uri: {auth_server.uri}\nstore_root: {tmp_path / 'store'}\n"
                      f"work_dir: {tmp_path / 'work'}\nevaluate:\n  suites: [bpb]\n")
    use_identity(monkeypatch, identity)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = CliRunner().invoke(app, ["run", "--config", str(config)])
    assert result.exit_code == 2, result.output
    who = ("the credentials of user 'pipeline' (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD)" if identity
           else "an anonymous client (set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)")
    assert result.stderr.splitlines() == [
        f"error: MLflow tracking server {auth_server.uri} refused {who}: HTTP 401 not authenticated "
        "(search_experiments)",
        "hint: check MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"], result.stderr
    assert not (tmp_path / "store").exists()
