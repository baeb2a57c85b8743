"""Shared fixtures. One Prefect test-harness server per session (its start costs 20-30 s)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system_tools import require, required

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="codemill-tests-"))
os.environ.setdefault("PREFECT_HOME", str(_SESSION_HOME / "prefect"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.system_tool(name)``: skip (or, under ``.ci/run``, fail) before any fixture starts a
    server the missing program would be needed for (tests/system_tools.py)."""
    for mark in item.iter_markers("system_tool"):
        for name in mark.args:
            require(name)


def bwrap_choices() -> list[str]:
    """Every bwrap the sandbox tests hold to one standard: the bundled one (what a fresh machine gets from pip)
    always, and the system's wherever one is installed (what ``auto`` prefers) or required (``.ci/run``)."""
    import shutil

    return ["bundled", *(["system"] if shutil.which("bwrap") or required() else [])]


@pytest.fixture(scope="module", params=bwrap_choices())
def bwrap_choice(request) -> Iterator[str]:
    """Forces ``CODEMILL_BWRAP`` for a module's sandboxes (and the servers they start), then restores it."""
    if request.param == "system":
        require("bwrap")
    before = os.environ.get("CODEMILL_BWRAP")
    os.environ["CODEMILL_BWRAP"] = request.param
    try:
        yield request.param
    finally:
        if before is None:
            os.environ.pop("CODEMILL_BWRAP", None)
        else:
            os.environ["CODEMILL_BWRAP"] = before


@pytest.fixture
def mlflow_uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


STDLIB_PACKAGES = ["json", "email", "http", "logging", "importlib", "concurrent", "xmlrpc", "urllib",
                   "wsgiref", "sqlite3", "html", "dbm", "zoneinfo", "tomllib", "curses", "ensurepip"]
STDLIB_MODULES = ["textwrap.py", "shlex.py", "csv.py", "heapq.py", "bisect.py", "fractions.py", "glob.py",
                  "fnmatch.py", "colorsys.py", "keyword.py", "string.py", "random.py"]


def make_small_corpus(root: Path) -> Path:
    """A few stdlib packages and modules copied into a folder: a real but small code corpus (~1.5 MB)."""
    import shutil
    import sysconfig

    std = Path(sysconfig.get_paths()["stdlib"])
    root.mkdir(parents=True, exist_ok=True)
    for pkg in STDLIB_PACKAGES:
        shutil.copytree(std / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__", "test*"))
    for mod in STDLIB_MODULES:
        shutil.copy2(std / mod, root / mod)
    return root


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    return make_small_corpus(tmp_path_factory.mktemp("corpus") / "pystd-small")


def free_port() -> int:
    """A port nothing listens on now (the OS picks it; a server started next binds it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto_server(extra_env: dict[str, str] | None = None):
    """A real ``moto.server`` subprocess on a free port (S3 over HTTP, as s3fs talks to AWS)."""
    import socket
    import subprocess
    import sys
    import time

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, **(extra_env or {})})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


def s3_bucket(endpoint: str, monkeypatch: pytest.MonkeyPatch, bucket: str):
    """A boto3 client on the moto server with ``bucket`` created, and the AWS_* variables the code under test
    reads set to it (credentials from the environment, as a user would set them)."""
    import boto3

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3", endpoint_url=endpoint)
    if bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=bucket)
    return client


@pytest.fixture(scope="session")
def s3_endpoint():
    proc, url = start_moto_server()
    yield url
    proc.terminate()
    proc.wait(timeout=10)


class MlflowServer:
    """A real ``mlflow server`` subprocess (SQLite backend, proxied artifacts) that can be stopped and restarted
    on the same port and database, to test the pipeline against a tracking server that goes away."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def app_args(self) -> list[str]:
        """Extra ``mlflow server`` options (a subclass runs another app)."""
        return []

    def environment(self) -> dict[str, str] | None:
        """The server's environment (None: this process's)."""
        return None

    def start(self, timeout: float = 90) -> MlflowServer:
        import subprocess
        import sys
        import time
        import urllib.request

        self.root.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "mlflow", "server", *self.app_args(), "--host", "127.0.0.1", "--port",
               str(self.port), "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}", "--serve-artifacts",
               "--artifacts-destination", str(self.root / "artifacts"), "--workers", "1"]
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"mlflow server at {self.uri} not healthy after {timeout} s")

    def stop(self) -> None:
        import signal

        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # uvicorn/gunicorn workers too
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def mlflow_server(tmp_path: Path):
    server = MlflowServer(tmp_path / "mlflow-server").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one thread for a module (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``): on a
    shared 2-core machine two spinning OpenMP threads make a tiny model's small ops about 10x slower."""
    from tests.tiny_policy import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    """A tiny untrained policy folder (HF model + tokenizer) for a module's rollout tests."""
    from tests.tiny_policy import make_policy

    return make_policy(tmp_path_factory.mktemp("policy"))
