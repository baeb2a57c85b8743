"""Noise calibration on real trainings (a small version of benchmarks/calibration.py): seeds of one config
differ, an existing training counts as a seed, the calibrated gate holds a seed-only candidate and still sees a
real regression and a real improvement. Also: system metrics and cost on the stage runs, MLflow links. (The
uncalibrated gate is covered by tests/unit/test_noise.py and the compare CLI test.)"""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from codemill import tags as T
from tests.integration.helpers import small_pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]

STEPS = 10


def _bpb(result: dict) -> dict:
    (m,) = [m for m in result["gate"]["metrics"] if m["metric"] == "val_bpb"]
    return m


def test_calibrated_gate_holds_seed_noise_and_sees_real_changes(small_corpus, tmp_path, monkeypatch):
    from codemill.flows.calibrate import calibrate
    from codemill.flows.pipeline import pipeline

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")
    cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=STEPS)
    cfg.evaluate.suites = ["bpb"]
    cfg.evaluate.bpb.max_files = 24
    cfg.evaluate.bootstrap_samples = 100

    def run(seed: int, steps: int = STEPS) -> dict:
        c = cfg.model_copy(deep=True)
        c.train.seed, c.train.max_steps = seed, steps
        return pipeline(config=c)

    champion = run(1234)
    assert champion["gate"]["verdict"] == "promote"

    cal = calibrate(config=cfg, seeds=3)
    assert cal["seeds"] == [1234, 1235, 1236]  # the champion's training counts as a seed: it is not redone
    assert cal["stages"]["train:1234"]["status"] != "ran" and cal["stages"]["train:1236"]["status"] == "ran"
    (row,) = cal["metrics"]
    assert row["metric"] == "val_bpb" and row["n_seeds"] == 3
    assert row["seed_sd"] > 0 and row["item_se"] > 0 and row["mde_better"] > row["se_total"] > row["item_se"]

    fresh_seed = run(1237)
    bpb = _bpb(fresh_seed)
    assert fresh_seed["gate"]["verdict"] == "hold", fresh_seed["gate"]
    assert fresh_seed["gate"]["calibrated"] and "uncalibrated" not in fresh_seed["gate"]["reason"]
    assert bpb["seed_sd"] == pytest.approx(row["seed_sd"]) and bpb["n_seeds"] == 3
    assert bpb["se"] == pytest.approx((bpb["se_item"] ** 2 + 2 * bpb["seed_sd"] ** 2) ** 0.5)

    worse = run(1238, steps=1)  # a tenth of the steps
    assert worse["gate"]["verdict"] == "regression", worse["gate"]
    better = run(1239, steps=3 * STEPS)  # three times the steps
    assert better["gate"]["verdict"] == "promote", better["gate"]
    assert _bpb(better)["diff"] > 0 and _bpb(better)["mde"] > 0

    client = MlflowClient(cfg.mlflow_tracking_uri)
    registered = client.get_registered_model(cfg.name)
    link = json.loads(registered.tags[T.calibration(cal["config_key"])])
    assert link["uri"] == cal["calibration"] and link["n_seeds"] == 3
    for seed, model in cal["models"].items():
        assert client.get_logged_model(model["model_id"]).tags[T.CONFIG_KEY] == cal["config_key"], seed
    train_run = client.get_run(cal["stages"]["train:1236"]["run_id"])
    assert train_run.data.metrics["cost_wall_s"] > 0 and train_run.data.metrics["cost_cpu_s"] > 0
    assert train_run.data.metrics["cost_gpu_s"] == 0  # CPU training
    assert any(k.startswith("system/cpu_utilization") for k in train_run.data.metrics), train_run.data.metrics
    assert cal["stages"]["train:1236"]["cost"]["wall_s"] == pytest.approx(train_run.data.metrics["cost_wall_s"])
