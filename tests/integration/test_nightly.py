"""The nightly flow: the first night trains from scratch and is promoted; the next fine-tunes from it."""

from __future__ import annotations

import pytest

from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]


def test_second_night_fine_tunes_from_the_first_nights_champion(small_corpus, tmp_path):
    from codemill.flows.nightly import champion_start, nightly

    cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=3)
    cfg.evaluate.suites = ["bpb"]
    # This recipe was never calibrated (test_calibration covers a calibrated nightly chain), so the gate is
    # uncalibrated and would hold anything below its hold margin; three more steps improve val_bpb by less
    # than that. This test is about the fine-tune chain and the item-level test, so it opts out of the margin.
    for m in cfg.gate.metrics:
        m.uncalibrated_margin = 0.0
    assert champion_start(cfg) is None
    first = nightly(config=cfg)
    assert first["gate"]["verdict"] == "promote"  # the first evaluated model becomes champion
    champion_dir = champion_start(cfg)
    assert champion_dir is not None

    second = nightly(config=cfg)
    store = ArtifactStore(cfg.store_root)
    train = store.read_manifest(ArtifactRef.model_validate(second["stages"]["train"]["ref"]))
    assert train.config["init_from"] == champion_dir
    tokenizer = store.read_manifest(ArtifactRef.model_validate(second["stages"]["tokenizer"]["ref"]))
    assert tokenizer.config["base_tokenizer"] == champion_dir  # the champion's tokenizer: same token ids
    assert second["model_id"] != first["model_id"]
    # Three more steps on the same data from the champion's weights lower the held-out bits per byte on the
    # same files: the paired improvement is significant, nothing regresses, so the gate must promote and the
    # alias must move to the new model (a hold or a regression here would be a gate or fine-tune bug).
    assert second["scores"]["val_bpb"] < first["scores"]["val_bpb"], (first["scores"], second["scores"])
    gate = second["gate"]
    assert gate["verdict"] == "promote", gate["reason"]
    assert "uncalibrated" in gate["reason"] and not gate["calibrated"]
    (bpb,) = [m for m in gate["metrics"] if m["metric"] == "val_bpb"]
    assert bpb["diff"] == pytest.approx(first["scores"]["val_bpb"] - second["scores"]["val_bpb"])
    assert bpb["p_improvement_holm"] < gate["alpha"] <= bpb["p_regression_holm"], bpb
    assert gate["previous_champion_model_id"] == first["model_id"]
    assert int(gate["champion_version"]) == int(first["gate"]["champion_version"]) + 1
    assert champion_start(cfg) not in (None, champion_dir)  # the third night would start from the second model
