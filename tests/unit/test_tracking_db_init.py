"""Two runs started together on a new SQLite tracking file: MLflow makes its tables at a process's first client,
and two processes doing that at once collide (``duplicate column name``). The first client is made under a lock
beside the file, so a second process waits for the first's tables instead of making them too."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

# A run's first MLflow client, as the pipeline makes it: says when its imports are done and its tables there.
FIRST_CLIENT = r"""
import sys
import mlflow.store.tracking.sqlalchemy_store
from codemill.lineage import Lineage
print("imported", flush=True)
Lineage(sys.argv[1], "exp")
print("ready", flush=True)
"""


def test_a_runs_first_client_waits_while_another_process_makes_the_tables(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    fd = os.open(tmp_path / ".mlflow.db.init.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another run is making the tables
    proc = subprocess.Popen([sys.executable, "-c", FIRST_CLIENT, f"sqlite:///{db}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "imported"
        deadline = time.monotonic() + 3  # making the tables takes about a second, were it not waiting
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, f"made its tables while another process held the lock: {proc.stderr.read()}"
        assert not db.exists() or db.stat().st_size == 0
    finally:
        os.close(fd)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == "ready", err[-2000:]
    assert db.stat().st_size > 0
