"""The ephemeral Prefect API started early (while the CLI imports the flows) is the server the flow then uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent("""
    import json
    from prefect import flow, get_client
    from prefect.server.api.server import SubprocessASGIServer
    from codemill.flows.server import start_ephemeral_api_early

    ready = start_ephemeral_api_early()
    ready()
    (early,) = SubprocessASGIServer._instances.values()

    @flow
    def probe() -> str:
        with get_client(sync_client=True) as client:
            client.hello()
            return str(client.api_url)

    used = probe()
    print(json.dumps({"early": early.api_url, "used": used, "servers": len(SubprocessASGIServer._instances),
                      "pid": early.server_process.pid}))
""")


def test_the_flow_uses_the_server_started_early(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["used"].rstrip("/") == got["early"].rstrip("/") and got["servers"] == 1
    with pytest.raises(ProcessLookupError):  # stopped at exit, as Prefect stops its own
        os.kill(got["pid"], 0)


def test_nothing_starts_when_a_server_is_configured():
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from codemill.flows.server import start_ephemeral_api_early

    before = dict(SubprocessASGIServer._instances)
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        start_ephemeral_api_early()()
    assert SubprocessASGIServer._instances == before
