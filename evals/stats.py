"""Statistics for eval scores: a metric's per-item scores, bootstrap confidence intervals over items (files,
problems), paired differences and their tests."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ItemScores:
    """One metric's per-item values for one model: the metric is sum(values) / sum(weights). What a suite makes
    of its rows (``Suite.item_scores``) and what the gate and the seed-noise calibration pair item by item."""

    item_ids: np.ndarray
    values: np.ndarray
    weights: np.ndarray
    clusters: np.ndarray
    higher_is_better: bool
    binary: bool = False  # per-item pass/fail (greedy pass@1): McNemar applies


@dataclass(frozen=True)
class Interval:
    point: float
    low: float
    high: float
    confidence: float
    n_items: int

    def as_dict(self, prefix: str) -> dict[str, float]:
        return {prefix: self.point, f"{prefix}_ci_low": self.low, f"{prefix}_ci_high": self.high}


def bootstrap_ratio_ci(numerators: np.ndarray, denominators: np.ndarray, clusters: np.ndarray | None = None, *,
                       samples: int, confidence: float, seed: int) -> Interval:
    """Percentile-bootstrap CI of sum(num)/sum(den), resampling whole clusters (each item alone if none).

    A ratio of sums (not a mean of per-item ratios) is what corpus-level bits-per-byte is, so items are
    weighted by their size exactly as in the point estimate; resampling clusters keeps correlated items
    (files of one repository) together.
    """
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    if num.shape != den.shape or num.ndim != 1 or num.size == 0:
        raise ValueError("need two 1-d arrays of the same non-zero length")
    ids = _cluster_ids(clusters, num.size)
    g = int(ids.max()) + 1
    cnum = np.bincount(ids, weights=num, minlength=g)
    cden = np.bincount(ids, weights=den, minlength=g)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, g, size=(samples, g))
    ratios = cnum[pick].sum(axis=1) / cden[pick].sum(axis=1)
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(ratios, [alpha, 1.0 - alpha])
    return Interval(point=float(num.sum() / den.sum()), low=float(low), high=float(high), confidence=confidence,
                    n_items=int(num.size))


# --- item-level estimates with clustered standard errors ------------------------------------------------
def _cluster_ids(clusters: np.ndarray | None, n: int) -> np.ndarray:
    if clusters is None:
        return np.arange(n)
    _, ids = np.unique(np.asarray(clusters), return_inverse=True)
    return ids


def ratio_estimate_se(values: np.ndarray, weights: np.ndarray | None = None,
                      clusters: np.ndarray | None = None) -> tuple[float, float, int]:
    """sum(values)/sum(weights) and its cluster-robust (linearized) standard error.

    Items in one cluster (files of one repository, samples of one problem) are not independent, so the
    variance sums residuals within each cluster first: SE by cluster, never by the items inside it.
    Returns (estimate, se, number of clusters).
    """
    v = np.asarray(values, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    if v.ndim != 1 or v.shape != w.shape or v.size == 0:
        raise ValueError("values and weights must be 1-d, equally long and non-empty")
    total_w = w.sum()
    est = float(v.sum() / total_w)
    ids = _cluster_ids(clusters, v.size)
    g = int(ids.max()) + 1
    resid = np.bincount(ids, weights=(v - est * w) / total_w, minlength=g)
    se = float(np.sqrt(g / (g - 1) * np.sum(resid**2))) if g > 1 else 0.0
    return est, se, g


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def normal_quantile(p: float) -> float:
    """Inverse CDF by bisection on erfc (no SciPy needed; 1e-12 accurate)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1.0 - normal_sf(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass
class PairedDifference:
    """candidate - reference on the same items, oriented so that positive means the candidate is better."""

    diff: float
    se: float
    ci_low: float
    ci_high: float
    n_items: int
    n_clusters: int


def paired_difference(candidate: np.ndarray, reference: np.ndarray, *, weights: np.ndarray | None = None,
                      clusters: np.ndarray | None = None, higher_is_better: bool = True,
                      confidence: float = 0.95) -> PairedDifference:
    d = np.asarray(candidate, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    if not higher_is_better:
        d = -d
    est, se, g = ratio_estimate_se(d, weights, clusters)
    z = normal_quantile(0.5 + confidence / 2)
    return PairedDifference(est, se, est - z * se, est + z * se, int(d.size), g)


def mcnemar_exact(candidate_pass: np.ndarray, reference_pass: np.ndarray) -> tuple[int, int, float]:
    """Exact McNemar test on paired pass/fail: (only candidate passed, only reference passed, two-sided p)."""
    a = np.asarray(candidate_pass, dtype=bool)
    b = np.asarray(reference_pass, dtype=bool)
    only_a, only_b = int(np.sum(a & ~b)), int(np.sum(~a & b))
    n = only_a + only_b
    if n == 0:
        return only_a, only_b, 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return only_a, only_b, min(1.0, 2 * tail)


def holm(pvalues: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (monotone, capped at 1), in the input order."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
