"""The gate's evidence: the metrics both models were scored on, a candidate of several seeds as their mean with
their spread, and the noise source with its provenance, as the gate task and ``codemill compare`` collect it."""

from __future__ import annotations

import numpy as np
import pytest

from codemill.evals.stats import ItemScores
from codemill.gate import preset_noise as pn
from codemill.gate.calibration import noise_source
from codemill.gate.evidence import GateMetric, NoiseSource, collect
from codemill.gate.noise import seed_noise, uncalibrated_margin
from codemill.gate.policy import decide
from codemill.store import ArtifactStore


def _scores(values: list[float]) -> ItemScores:
    n = len(values)
    return ItemScores(np.array([f"i{k}" for k in range(n)]), np.array(values), np.ones(n), np.arange(n), True)


def test_collect_keeps_the_metrics_both_were_scored_on_and_averages_the_candidates_seeds():
    seeds = [{"m": _scores([1.0, 0.0, 1.0]), "only_candidate": _scores([1.0])},
             {"m": _scores([0.0, 0.0, 1.0]), "only_candidate": _scores([1.0])}]
    reference = {"m": _scores([0.0, 1.0, 0.0]), "only_reference": _scores([0.0])}
    ev = collect(seeds, reference, [GateMetric("m"), GateMetric("only_candidate"), GateMetric("only_reference")])
    assert [m.name for m in ev.metrics] == ["m"] and ev.candidate_seeds == 2
    assert ev.candidate["m"].values.tolist() == [0.5, 0.0, 1.0] and ev.run_noise["m"].n_seeds == 2
    assert ev.noise == NoiseSource() and not collect(seeds[:1], reference, [GateMetric("m")]).run_noise
    with pytest.raises(ValueError, match=r"no gate metric was evaluated for both models \(configured: "
                                         r"\['only_reference'\], evaluated: \['m', 'only_candidate'\]\)"):
        collect(seeds, reference, [GateMetric("only_reference")])


def test_the_verdict_names_the_calibration_only_for_calibrated_metrics():
    cand, ref = {"m": _scores([1.0] * 40)}, {"m": _scores([0.0] * 40)}
    noise = {"m": seed_noise("m", [0.1, 0.2, 0.15])}
    calibrated = decide(collect([cand], ref, [GateMetric("m")], NoiseSource("calibration", noise, "store/cal")))
    assert calibrated.calibrated and calibrated.calibration == "store/cal"
    labelled_only = decide(collect([cand], ref, [GateMetric("m")], NoiseSource(uri="store/cal")))
    assert not labelled_only.calibrated and labelled_only.calibration is None


def test_a_champion_outside_the_store_is_uncalibrated_with_the_noisiest_presets_margins(tmp_path):
    found = noise_source(ArtifactStore(str(tmp_path)), None, {}, ["val_bpb", "humaneval_pass_at_1"])
    presets = pn.load_preset_noise()
    noisiest = pn.nearest(presets, None)
    assert found.source == "none" and not found.metrics and found.uri is None and found.recipe_key is None
    assert noisiest is not None and found.hold_margins_from == noisiest.preset
    assert found.hold_margins == pn.hold_margins(noisiest, ["val_bpb", "humaneval_pass_at_1"])
    assert found.hold_margins["val_bpb"] >= uncalibrated_margin("val_bpb") == 0.12
    assert found.advice == "codemill calibrate --seeds 10"
