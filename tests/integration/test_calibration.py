"""Noise calibration on real trainings (a small version of benchmarks/calibration.py): seeds of one config
differ, an existing training counts as a seed, the calibrated gate holds a seed-only candidate and still sees a
real regression and a real improvement. Also: system metrics and cost on the stage runs, MLflow links. (The
uncalibrated gate is covered by tests/unit/test_noise.py and the compare CLI test.)"""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from codemill.lineage import tags as T
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
    assert cal["stages"]["seed1234:train"]["status"] != "ran" and cal["stages"]["seed1236:train"]["status"] == "ran"
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
    link = json.loads(registered.tags[T.calibration(cal["recipe_key"])])
    assert link["uri"] == cal["calibration"] and link["n_seeds"] == 3
    for seed, model in cal["models"].items():
        assert client.get_logged_model(model["model_id"]).tags[T.RECIPE_KEY] == cal["recipe_key"], seed
    train_run = client.get_run(cal["stages"]["seed1236:train"]["run_id"])
    assert train_run.data.metrics["cost_wall_s"] > 0 and train_run.data.metrics["cost_cpu_s"] > 0
    assert train_run.data.metrics["cost_gpu_s"] == 0  # CPU training
    assert any(k.startswith("system/cpu_utilization") for k in train_run.data.metrics), train_run.data.metrics
    assert cal["stages"]["seed1236:train"]["cost"]["wall_s"] == pytest.approx(train_run.data.metrics["cost_wall_s"])


def test_a_calibration_of_the_nightly_recipe_survives_a_new_champion_and_seeds_in_the_run(small_corpus, tmp_path):
    """``calibrate --from-champion`` fine-tunes its seeds from the champion; once a fine-tuned model is the
    champion, the gate finds that calibration (the recipe leaves out the starting weights), night after night.
    ``train.seeds: 3`` trains the candidate three times and gates the mean with their spread."""
    from codemill.flows.calibrate import calibrate
    from codemill.flows.nightly import nightly
    from codemill.flows.pipeline import pipeline
    from codemill.gate.calibration import noise_source
    from codemill.store import ArtifactStore

    cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=STEPS)
    cfg.evaluate.suites = ["bpb"]
    cfg.evaluate.bpb.max_files = 24
    cfg.evaluate.bootstrap_samples = 100
    weak = cfg.model_copy(deep=True)
    weak.train.max_steps = 2
    first = pipeline(config=weak)  # a scratch champion of another recipe
    assert first["gate"]["verdict"] == "promote"

    cal = calibrate(config=cfg, seeds=2, from_champion=True)
    night1 = nightly(config=cfg)  # fine-tuned from the first champion: its training is the calibration's seed 1234
    assert night1["stages"]["train"]["ref"]["digest"] == cal["models"][1234]["digest"]
    g1 = night1["gate"]
    assert not g1["calibrated"] and g1["noise_source"] == "none", g1  # the champion is a 2-step scratch model
    # the champion was trained with 2 steps, this config trains 10: calibrating this config would not help
    assert "`codemill calibrate --seeds 10 with the champion's config`" in g1["reason"], g1["reason"]
    assert "hold margin (from preset tiny's seed noise)" in g1["reason"]
    assert g1["verdict"] == "promote", g1  # 12 steps beat 2 by far more than any hold margin

    night2 = nightly(config=cfg)  # from a new champion: other starting weights, same recipe
    assert night2["stages"]["train"]["ref"]["digest"] != night1["stages"]["train"]["ref"]["digest"]
    g2 = night2["gate"]
    assert g2["calibrated"] and g2["noise_source"] == "calibration" and g2["calibration"] == cal["calibration"], g2
    assert _bpb(night2)["n_seeds"] == 2
    store = ArtifactStore(cfg.store_root)
    found = noise_source(store, night2["stages"]["train"]["ref"]["digest"], cfg.evaluate.digest_config(), ["val_bpb"])
    assert found.recipe_key == cal["recipe_key"] and found.advice.endswith("--from-champion")

    seeded = cfg.model_copy(deep=True)
    seeded.train.seed, seeded.train.seeds = 2000, 3
    out = pipeline(config=seeded)
    assert {"seed2001:train", "seed2002:train", "seed2001:bpb", "seed2002:bpb"} <= set(out["stages"])
    assert out["gate"]["candidate_seeds"] == [2000, 2001, 2002]
    assert out["model_id"] == out["stages"]["train"]["model_id"]  # the seed the config names is the candidate
    bpb = _bpb(out)
    # the champion (a fine-tune) is charged its calibration's 2 seeds, the candidate's mean its own 3 seeds' spread
    assert out["gate"]["calibrated"] and bpb["n_seeds"] == 2 and bpb["candidate_seeds"] == 3
    assert bpb["candidate_seed_sd"] is not None and bpb["candidate_seed_sd"] > 0
    assert bpb["se"] == pytest.approx((bpb["se_item"] ** 2 + bpb["seed_sd"] ** 2 + bpb["candidate_seed_sd"] ** 2 / 3)
                                      ** 0.5)
    assert "the candidate is the mean of 3 seeds' models" in out["gate"]["reason"]
