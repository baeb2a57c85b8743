import math

import numpy as np
import pytest

from codemill.evals.humaneval import STOP_SEQUENCES, pass_at_k
from codemill.evals.stats import (
    ItemScores,
    bootstrap_ratio_ci,
    holm,
    mcnemar_exact,
    normal_quantile,
    normal_sf,
    paired_difference,
    ratio_estimate_se,
)
from codemill.gate.evidence import GateMetric, collect
from codemill.gate.policy import decide
from codemill.gate.report import markdown_report
from codemill.models.engines import truncate_at_stop


def test_pass_at_k_matches_combinatorial_definition():
    for n, c, k in [(10, 3, 1), (10, 3, 5), (20, 0, 10), (5, 5, 2), (7, 2, 7)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 5)


def test_truncate_at_first_stop_sequence():
    assert truncate_at_stop("    return x\n\ndef g():\n    pass", STOP_SEQUENCES) == ("    return x\n", True)
    assert truncate_at_stop("    return 1\n# comment\nif x:", STOP_SEQUENCES) == ("    return 1", True)
    assert truncate_at_stop("    return 1", STOP_SEQUENCES) == ("    return 1", False)


def test_ratio_se_equals_classic_se_of_mean_without_clusters():
    rng = np.random.default_rng(0)
    x = rng.normal(size=500)
    est, se, g = ratio_estimate_se(x)
    assert est == pytest.approx(x.mean()) and g == 500
    assert se == pytest.approx(x.std(ddof=1) / np.sqrt(x.size), rel=1e-9)


def test_clustering_widens_se_for_correlated_items():
    rng = np.random.default_rng(1)
    cluster_effect = np.repeat(rng.normal(size=20), 25)
    x = cluster_effect + 0.1 * rng.normal(size=500)
    clusters = np.repeat(np.arange(20), 25)
    _, se_naive, _ = ratio_estimate_se(x)
    _, se_clustered, g = ratio_estimate_se(x, clusters=clusters)
    assert g == 20 and se_clustered > 3 * se_naive


def test_cluster_bootstrap_is_wider_for_correlated_items():
    """Files of one repository share a rate: resampling whole repositories must widen the CI (each file alone
    would understate the uncertainty), and the point estimate is the same ratio of sums either way."""
    rng = np.random.default_rng(2)
    clusters = np.arange(200) // 10  # 20 repositories of 10 files
    w = rng.integers(10, 100, size=200).astype(float)
    rate = np.repeat(rng.gamma(4, 0.5, size=20), 10) + 0.05 * rng.normal(size=200)  # shared within a repository
    v = rate * w
    clustered = bootstrap_ratio_ci(v, w, clusters, samples=2000, confidence=0.95, seed=0)
    per_item = bootstrap_ratio_ci(v, w, None, samples=2000, confidence=0.95, seed=0)
    assert clustered.point == per_item.point == pytest.approx(v.sum() / w.sum())
    assert clustered.low < clustered.point < clustered.high
    assert per_item.low < per_item.point < per_item.high
    width_c, width_i = clustered.high - clustered.low, per_item.high - per_item.low
    assert width_c > 2 * width_i, (width_c, width_i)


def test_normal_helpers():
    assert normal_sf(0) == pytest.approx(0.5)
    assert normal_sf(1.959963985) == pytest.approx(0.025, abs=1e-9)
    assert normal_quantile(0.975) == pytest.approx(1.959963985, abs=1e-8)


def test_mcnemar_exact_by_hand():
    a = np.array([1, 1, 1, 1, 1, 0, 1, 0], dtype=bool)
    b = np.array([0, 0, 0, 0, 0, 0, 1, 0], dtype=bool)
    only_a, only_b, p = mcnemar_exact(a, b)
    assert (only_a, only_b) == (5, 0)
    assert p == pytest.approx(2 / 32)
    assert mcnemar_exact(a, a)[2] == 1.0


def test_holm_adjustment():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]


def test_paired_difference_orientation():
    cand, ref = np.array([1.0, 2.0, 3.0]), np.array([2.0, 3.0, 4.0])
    assert paired_difference(cand, ref).diff == pytest.approx(-1.0)
    assert paired_difference(cand, ref, higher_is_better=False).diff == pytest.approx(1.0)


def _bits(rng, n, quality):
    """Per-file NLL bits for a model of a given quality (lower bits = better), with per-file noise."""
    bytes_ = rng.integers(200, 5000, size=n).astype(float)
    return bytes_ * (quality + 0.05 * rng.normal(size=n)), bytes_


def _scores(bits, bytes_, ids, clusters):
    return ItemScores(ids, bits, bytes_, clusters, higher_is_better=False)


def test_gate_promotes_better_flags_worse_and_holds_same():
    rng = np.random.default_rng(3)
    n = 300
    ids, clusters = np.array([f"f{i}" for i in range(n)]), np.arange(n) // 10
    base, bytes_ = _bits(rng, n, 2.0)
    better = base - bytes_ * 0.2
    worse = base + bytes_ * 0.2
    metrics = [GateMetric("bpb", margin=0.01)]
    champ = {"bpb": _scores(base, bytes_, ids, clusters)}
    assert decide(collect([{"bpb": _scores(better, bytes_, ids, clusters)}], champ, metrics)).verdict == "promote"
    worse_v = decide(collect([{"bpb": _scores(worse, bytes_, ids, clusters)}], champ, metrics))
    assert worse_v.verdict == "regression" and worse_v.metrics[0].p_regression_holm < 1e-6
    same = decide(collect([champ], champ, metrics))
    assert same.verdict == "hold" and same.metrics[0].diff == 0
    assert "regression" in markdown_report(worse_v, "gate")


def test_gate_needs_shared_items():
    a = ItemScores(np.array(["a"]), np.array([1.0]), np.array([1.0]), np.array([0]), True)
    b = ItemScores(np.array(["b"]), np.array([1.0]), np.array([1.0]), np.array([0]), True)
    with pytest.raises(ValueError, match="share no items"):
        decide(collect([{"m": a}], {"m": b}, [GateMetric("m")]))
