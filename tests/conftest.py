"""Shared fixtures. One Prefect test-harness server per session (its start costs 20-30 s)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

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


def start_moto_server(extra_env: dict[str, str] | None = None):
    """A real ``moto.server`` subprocess on a free port (S3 over HTTP, as s3fs talks to AWS)."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, **(extra_env or {})})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def s3_endpoint():
    proc, url = start_moto_server()
    yield url
    proc.terminate()
    proc.wait(timeout=10)
