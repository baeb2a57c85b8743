"""What a run does not pay for needlessly: planning the tiny preset and closing the run load neither torch nor
transformers, a model's loss curve is drawn once, then read back, torch's threads sleep instead of spinning while
they wait (unless the user says otherwise), and MLflow's database store is imported ahead only when it is used."""

from __future__ import annotations

import json
import subprocess
import sys

from codemill.flows.artifacts import loss_curve
from codemill.plan import StagePlan
from codemill.store import ArtifactStore

PLAN_AND_CLOSE = """
import sys
from codemill.config import load_preset
from codemill.flows.run import close_live_vllm
from codemill.flows.plan import plan_pipeline
from codemill.store import ArtifactStore

cfg = load_preset("tiny")
plan_pipeline(cfg, [], ArtifactStore(sys.argv[1]))
close_live_vllm()
print(sorted(m for m in ("torch", "transformers", "matplotlib") if m in sys.modules))
"""


def test_planning_the_tiny_run_and_closing_it_load_no_model_code(tmp_path):
    from codemill.evals.latency import torch_build

    build = torch_build()
    gpu_build = build.get("cuda") is not None or build.get("hip") is not None  # the latency plan asks torch then
    out = subprocess.run([sys.executable, "-c", PLAN_AND_CLOSE, str(tmp_path / "store")], capture_output=True,
                         text=True, timeout=300, check=True)
    loaded = json.loads(out.stdout.strip().replace("'", '"'))
    assert loaded == (["torch"] if gpu_build else []), out.stderr[-2000:]


def test_a_loss_curve_is_drawn_once_per_model(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"), cache_dir=tmp_path / "cache")
    plan = StagePlan(stage="train", name="model", code_version="test")
    with store.writer(plan) as w:
        w.path("train_summary.json").write_text(json.dumps({"losses": [3.0, 2.5, 2.0], "val_losses": {"2": 2.7}}))
        w.finish({})
    ref = store.ref_for(plan)
    png = loss_curve(store, ref)
    assert png.startswith(b"\x89PNG")
    (cached,) = (tmp_path / "cache" / "loss-curves").iterdir()
    assert cached.read_bytes() == png and cached.name == f"model-{ref.short}.png"
    cached.write_bytes(b"drawn before")
    assert loss_curve(store, ref) == b"drawn before"  # read back, not drawn again


THREADS = """
import os, sys
from codemill.cli import app
try:
    app(["presets"])
except SystemExit:
    pass
print(os.environ.get("OMP_WAIT_POLICY"))
"""


def test_every_command_lets_torch_threads_sleep_unless_told_otherwise():
    import os

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    for given, expected in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        run_env = env if given is None else {**env, "OMP_WAIT_POLICY": given}
        out = subprocess.run([sys.executable, "-c", THREADS], env=run_env, capture_output=True, text=True,
                             timeout=120, check=True)
        assert out.stdout.strip().splitlines()[-1] == expected


PRELOAD = """
import sys
from codemill.lineage import preload_store
preload_store(sys.argv[1])
print("mlflow.store.tracking.sqlalchemy_store" in sys.modules)
"""


def test_the_database_store_module_is_imported_ahead_only_for_a_database_uri():
    """The CLI imports it while Prefect's temporary server boots; a server URI has nothing to import ahead."""
    for uri, expected in (("sqlite:///mlflow.db", "True"), ("postgresql+psycopg2://u@h/db", "True"),
                          ("http://127.0.0.1:5000", "False")):
        out = subprocess.run([sys.executable, "-c", PRELOAD, uri], capture_output=True, text=True, timeout=120,
                             check=True)
        assert out.stdout.strip().splitlines()[-1] == expected, uri
