"""The gate on real models: a weak and a strong checkpoint of the same pipeline, and one model twice."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mlflow import MlflowClient

from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]
REPORT_DIR = Path(os.environ.get("CODEMILL_TEST_ARTIFACTS", "test-artifacts"))


def _evidence(verdict: dict) -> dict:
    return {m["metric"]: {"diff": m["diff"], "p_regression_holm": m["p_regression_holm"],
                          "p_improvement_holm": m["p_improvement_holm"]} for m in verdict["metrics"]}


def test_gate_promotes_the_better_flags_the_worse_and_holds_the_same(small_corpus, tmp_path):
    from codemill.flows.evaluate import evaluate
    from codemill.flows.pipeline import pipeline

    weak_cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=3)
    weak = pipeline(config=weak_cfg)
    assert weak["gate"]["verdict"] == "promote" and "first" in weak["gate"]["reason"]

    strong_cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=60)
    strong = pipeline(config=strong_cfg)
    assert strong["stages"]["tokenize"]["status"] == "cached"  # only training and eval differ
    assert strong["scores"]["val_bpb"] < weak["scores"]["val_bpb"]
    promoted = strong["gate"]
    assert promoted["verdict"] == "promote", promoted
    assert promoted["previous_champion_model_id"] == weak["model_id"]
    by_metric = {m["metric"]: m for m in promoted["metrics"]}
    assert by_metric["val_bpb"]["p_improvement_holm"] < 0.05 and by_metric["val_bpb"]["diff"] > 0

    corpus = ArtifactRef.model_validate(strong["stages"]["ingest"]["ref"]).uri
    # the weak model comes back against the strong champion: a regression, and the champion stays
    back = evaluate(model=weak["model_id"], config=weak_cfg, corpus=corpus)
    assert back["gate"]["verdict"] == "regression", back["gate"]
    assert {m["metric"]: m for m in back["gate"]["metrics"]}["val_bpb"]["p_regression_holm"] < 0.05

    # the champion's own weights, evaluated again as a plain HF folder (a new model id): not a regression
    hf_dir = ArtifactStore(strong_cfg.store_root).local_path(
        ArtifactRef.model_validate(strong["stages"]["train"]["ref"])) / "hf"
    same = evaluate(model=str(hf_dir), config=strong_cfg, corpus=corpus)
    assert same["model_id"] != strong["model_id"]
    assert same["gate"]["verdict"] == "hold", same["gate"]
    assert all(m["diff"] == 0 for m in same["gate"]["metrics"])

    client = MlflowClient(strong_cfg.mlflow_tracking_uri)
    champion = client.get_model_version_by_alias(strong_cfg.name, "champion")
    assert champion.tags["codemill.model_id"] == strong["model_id"]
    parent = client.get_run(back["parent_run_id"])
    assert parent.data.tags["codemill.gate.verdict"] == "regression"
    assert "gate_report.md" in {a.path for a in client.list_artifacts(back["parent_run_id"])}

    REPORT_DIR.mkdir(exist_ok=True)
    (REPORT_DIR / "gate_verdicts.json").write_text(json.dumps(
        {"strong_vs_weak": {"verdict": promoted["verdict"], **_evidence(promoted)},
         "weak_vs_strong": {"verdict": back["gate"]["verdict"], **_evidence(back["gate"])},
         "same_model": {"verdict": same["gate"]["verdict"], **_evidence(same["gate"])}}, indent=2))
