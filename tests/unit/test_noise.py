"""The training-noise statistics against hand-computed values: seed variance, the variance of a comparison of two
independent trainings, Satterthwaite degrees of freedom, the minimum detectable effect, the uncalibrated hold."""

from __future__ import annotations

import math

import numpy as np
import pytest

from codemill.evals.stats import ItemScores
from codemill.gate.calibration import config_key
from codemill.gate.evidence import GateMetric, NoiseSource, collect
from codemill.gate.noise import (
    UNCALIBRATED_MARGINS,
    NoiseModel,
    SeedNoise,
    combined_se,
    detectable,
    mde,
    noise_model,
    satterthwaite_df,
    seed_noise,
)
from codemill.gate.policy import decide
from codemill.gate.report import markdown_report
from codemill.gate.scores import calibrate
from codemill.report import comparison_text, gate_noise_table

Z95, Z80 = 1.6448536269514722, 0.8416212335729143  # standard normal quantiles


def test_seed_variance_and_rms_item_se_by_hand():
    n = seed_noise("m", [1.0, 2.0, 3.0], [0.3, 0.4])
    assert n.n_seeds == 3
    assert n.seed_var == pytest.approx(1.0)  # ((1-2)^2 + 0 + (3-2)^2) / (3 - 1)
    assert n.item_se == pytest.approx(math.sqrt((0.09 + 0.16) / 2))
    with pytest.raises(ValueError, match="at least 2 seeds"):
        seed_noise("m", [1.0])
    assert SeedNoise.from_dict(n.as_dict()) == n


def test_comparison_variance_is_item_variance_plus_twice_the_seed_variance():
    assert combined_se(0.3, 0.08) == pytest.approx(0.5)  # sqrt(0.09 + 2 * 0.08)
    assert combined_se(0.3, 0.0) == pytest.approx(0.3)
    assert satterthwaite_df(0.3, 0.08, 5) == pytest.approx(0.25**2 / (0.16**2 / 4))  # 9.765625
    assert math.isinf(satterthwaite_df(0.3, 0.0, 5))


def test_mde_by_hand():
    assert mde(0.1, math.inf, 0.05) == pytest.approx((Z95 + Z80) * 0.1)  # 0.24865
    assert mde(1.0, 4, 0.05) == pytest.approx(2.131847 + 0.940965, abs=1e-5)  # t(0.95, 4) + t(0.80, 4)
    # uncalibrated: a difference must also exceed the hold margin, which dominates a small SE
    assert mde(0.01, math.inf, 0.05, hold_margin=0.1) == pytest.approx(0.1 + Z80 * 0.01)
    # a regression must exceed the tolerated margin plus the critical value
    assert mde(0.1, math.inf, 0.05, test_margin=0.02) == pytest.approx(0.02 + (Z95 + Z80) * 0.1)
    # two metrics: Holm's first step compares with alpha / 2
    better, worse = detectable(NoiseModel(0.1, 0.0, 5, 0.0), 0.05, 2, 0.02)
    z975 = 1.959963984540054
    assert better == pytest.approx((z975 + Z80) * 0.1) and worse == pytest.approx(0.02 + (z975 + Z80) * 0.1)


def test_uncalibrated_margin_defaults():
    m = noise_model("val_bpb", 0.01, None)
    assert not m.calibrated and m.hold_margin == UNCALIBRATED_MARGINS["val_bpb"] == 0.12 and m.se == 0.01
    assert noise_model("val_bpb", 0.01, None, 0.02).hold_margin == 0.02
    assert noise_model("something_else", 0.01, None).hold_margin == 0.05
    cal = noise_model("val_bpb", 0.01, seed_noise("val_bpb", [1.0, 1.1]))
    assert cal.calibrated and cal.hold_margin == 0.0 and cal.se == pytest.approx(math.sqrt(0.0001 + 2 * 0.005))


def _bpb(diff_per_byte: float, noise: float = 0.001, n: int = 200, seed: int = 0):
    """Champion and candidate per-file bits on the same files; the candidate is better by diff bits/byte."""
    rng = np.random.default_rng(seed)
    ids, clusters = np.array([f"f{i}" for i in range(n)]), np.arange(n) // 5
    bytes_ = rng.integers(500, 2000, size=n).astype(float)
    champ_bits = bytes_ * (2.5 + 0.05 * rng.normal(size=n))
    cand_bits = champ_bits - bytes_ * (diff_per_byte + noise * rng.normal(size=n))
    return ({"val_bpb": ItemScores(ids, cand_bits, bytes_, clusters, False)},
            {"val_bpb": ItemScores(ids, champ_bits, bytes_, clusters, False)})


def test_gate_uncalibrated_holds_below_the_default_margin_and_says_so():
    cand, champ = _bpb(0.05)  # 0.05 bpb better, item SE tiny: significant on items alone
    v = decide(collect([cand], champ, [GateMetric("val_bpb", 0.01)]))
    (e,) = v.metrics
    assert e.p_improvement_holm < 1e-6 and e.diff == pytest.approx(0.05, abs=0.002)
    assert v.verdict == "hold" and "uncalibrated" in v.reason and not v.calibrated
    assert "**uncalibrated**" in markdown_report(v, "gate")
    # the same evidence with a smaller configured hold margin is a promote, still flagged uncalibrated
    v2 = decide(collect([cand], champ, [GateMetric("val_bpb", 0.01, uncalibrated_margin=0.02)]))
    assert v2.verdict == "promote" and "uncalibrated" in v2.reason
    worse_c, worse_h = _bpb(-0.05)
    assert decide(collect([worse_c], worse_h, [GateMetric("val_bpb", 0.01)])).verdict == "hold"
    assert decide(collect([worse_c], worse_h, [GateMetric("val_bpb", 0.01, 0.02)])).verdict == "regression"


def test_gate_adds_twice_the_seed_variance():
    cand, champ = _bpb(0.05)
    noisy = {"val_bpb": seed_noise("val_bpb", [2.40, 2.50, 2.45, 2.55, 2.35])}  # seed SD 0.079
    v = decide(collect([cand], champ, [GateMetric("val_bpb", 0.01)],
                       NoiseSource("calibration", noisy, "store/calibrate/noise-x")))
    (e,) = v.metrics
    var = noisy["val_bpb"].seed_var
    assert var == pytest.approx(0.00625)
    assert e.se == pytest.approx(math.sqrt(e.se_item**2 + 2 * var))
    assert e.seed_sd == pytest.approx(math.sqrt(var)) and e.n_seeds == 5 and e.calibrated
    assert e.df == pytest.approx(satterthwaite_df(e.se_item, var, 5))
    from scipy import stats

    assert e.p_improvement == pytest.approx(stats.t.sf(e.diff / e.se, e.df))
    assert e.ci_high - e.ci_low == pytest.approx(2 * stats.t.ppf(0.975, e.df) * e.se)
    assert e.mde == pytest.approx((stats.t.ppf(0.95, e.df) + stats.t.ppf(0.8, e.df)) * e.se)
    assert v.verdict == "hold" and v.calibrated and "uncalibrated" not in v.reason  # 0.05 is within seed noise
    quiet = {"val_bpb": seed_noise("val_bpb", [2.450, 2.451, 2.449, 2.450, 2.4505])}
    quiet_v = decide(collect([cand], champ, [GateMetric("val_bpb", 0.01)], NoiseSource("calibration", quiet)))
    assert quiet_v.verdict == "promote"
    md = markdown_report(v, "gate")
    assert "calibrated, between-seed variance from 5 seeds (store/calibrate/noise-x)" in md
    assert f"{e.seed_sd:.4f} (5)" in md and f"{e.mde:.4f}" in md


def test_calibrate_from_seed_scores():
    rng = np.random.default_rng(1)
    ids, w, clusters = np.array([f"f{i}" for i in range(50)]), np.full(50, 100.0), np.arange(50)
    seeds = [{"val_bpb": ItemScores(ids, w * (2.5 + s + 0.01 * rng.normal(size=50)), w, clusters, False)}
             for s in (0.0, 0.1, 0.2)]
    (name, n), = calibrate(seeds).items()
    assert name == "val_bpb" and n.n_seeds == 3
    assert n.seed_sd == pytest.approx(0.1, abs=0.003) and 0 < n.item_se < 0.01
    with pytest.raises(ValueError):
        calibrate(seeds[:1])


def test_config_key_ignores_only_the_seed():
    a = config_key("train-v2", {"seed": 1, "max_steps": 10}, {"tokens": "t"})
    assert a == config_key("train-v2", {"seed": 2, "max_steps": 10}, {"tokens": "t"})
    assert a != config_key("train-v2", {"seed": 1, "max_steps": 11}, {"tokens": "t"})
    assert a != config_key("train-v2", {"seed": 1, "max_steps": 10}, {"tokens": "u"})


def test_reports_fit_in_80_columns_and_show_both_components():
    cand, champ = _bpb(0.05)
    noise = NoiseSource("calibration", {"val_bpb": seed_noise("val_bpb", [2.4, 2.5, 2.45])})
    v = decide(collect([cand], champ, [GateMetric("val_bpb", 0.01)], noise)).as_dict()
    result = {"model_a": "m-" + "a" * 32, "model_b": "m-" + "b" * 32, "alpha": 0.05, **v,
              "calibration": "/very/long/path/" + "x" * 90}
    text = comparison_text(result)
    assert max(map(len, text.splitlines())) <= 80, text
    assert "SE item" in text and "seed SD" in text and "(3 seeds)" in text and "MDE (80% power)" in text
    table = "\n".join(gate_noise_table(v))
    assert "| val_bpb |" in table and "(3)" in table and "uncalibrated" not in table
