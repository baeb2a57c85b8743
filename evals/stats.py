"""Statistics for eval scores: bootstrap confidence intervals over items (files, problems)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    point: float
    low: float
    high: float
    confidence: float
    n_items: int

    def as_dict(self, prefix: str) -> dict[str, float]:
        return {prefix: self.point, f"{prefix}_ci_low": self.low, f"{prefix}_ci_high": self.high}


def bootstrap_ratio_ci(numerators: np.ndarray, denominators: np.ndarray, *, samples: int, confidence: float,
                       seed: int) -> Interval:
    """CI of sum(num)/sum(den) resampling items with replacement (percentile bootstrap).

    A ratio of sums (not a mean of per-item ratios) is what corpus-level bits-per-byte is, so items are
    weighted by their size exactly as in the point estimate.
    """
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    if num.shape != den.shape or num.ndim != 1 or num.size == 0:
        raise ValueError("need two 1-d arrays of the same non-zero length")
    point = float(num.sum() / den.sum())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, num.size, size=(samples, num.size))
    ratios = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(ratios, [alpha, 1.0 - alpha])
    return Interval(point=point, low=float(low), high=float(high), confidence=confidence, n_items=int(num.size))
