"""`codemill serve` against a real ``prefect server start`` with API authentication (PREFECT_SERVER_API_AUTH_STRING):
without or with a wrong PREFECT_API_AUTH_STRING it stops before serving, naming the API; with the right one it
registers its deployments. The server runs on a copy of the session harness's database (already migrated), so it
starts in seconds."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codemill.cli import app
from codemill.flows.serve import PrefectApiAuthError, build_deployments, check_api_access
from tests.conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]

AUTH = "codemill:prefect-auth-test-1234"


@pytest.fixture(scope="module")
def auth_api(prefect_harness, tmp_path_factory) -> Iterator[str]:
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

    root = tmp_path_factory.mktemp("prefect-auth")
    source = sqlite3.connect(PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split(":///", 1)[1])
    with sqlite3.connect(root / "prefect.db") as copy:
        source.backup(copy)
    source.close()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(root / "home"), "PREFECT_SERVER_API_AUTH_STRING": AUTH,
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{root / 'prefect.db'}",
            "PREFECT_SERVER_DATABASE_MIGRATE_ON_START": "false", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    cmd = [str(Path(sys.executable).with_name("prefect")), "server", "start", "--host", "127.0.0.1", "--port",
           str(port), "--no-services", "--no-ui"]
    log = open(root / "server.log", "ab")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, (root / "server.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "prefect server did not start"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                break
        except OSError:
            time.sleep(0.3)
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def _settings(url: str, auth: str | None):
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    return temporary_settings(updates={PREFECT_API_URL: url, PREFECT_API_AUTH_STRING: auth})


def test_the_server_refuses_a_request_without_the_auth_string(auth_api):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{auth_api}/hello", timeout=10)
    assert refused.value.code == 401


@pytest.mark.parametrize("auth, hint", [(None, "set PREFECT_API_AUTH_STRING"),
                                        ("codemill:wrong", "does not match the server's")], ids=["none", "wrong"])
def test_serve_stops_before_serving_without_the_right_auth_string(auth_api, auth, hint):
    with _settings(auth_api, auth):
        with pytest.raises(PrefectApiAuthError) as denied:
            check_api_access()
        assert str(denied.value).startswith(f"Prefect API {auth_api} refused this client: HTTP 401")
        assert hint in str(denied.value)
        result = CliRunner().invoke(app, ["serve"], terminal_width=300)
    assert result.exit_code == 2, result.output
    assert f"Prefect API {auth_api} refused this client: HTTP 401" in result.output


def test_serve_authenticates_with_the_auth_string(auth_api):
    from prefect import get_client

    with _settings(auth_api, AUTH):
        check_api_access()
        deployment = build_deployments()[0]
        deployment_id = deployment.apply()
        with get_client(sync_client=True) as client:
            assert client.read_deployment(deployment_id).name == deployment.name
