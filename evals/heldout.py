"""Did RL help on problems it never trained on? Held-out pass rates of two policies, compared per problem.

Both policies sample the same held-out problems k times each (same prompts, same sampling settings). A
problem's pass rate is the mean binary reward of its k samples; the comparison pairs the two policies on each
problem (``evals.stats.paired_difference``: the samples of one problem are not independent, so the problem is
the unit) and reports a normal-approximation p-value of "no difference". Pass rates carry a cluster-robust
confidence interval over problems.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from codemill.evals.stats import normal_quantile, normal_sf, paired_difference, ratio_estimate_se


@dataclass(frozen=True)
class PassRate:
    rate: float
    ci_low: float
    ci_high: float
    problems: int
    samples: int


@dataclass(frozen=True)
class PassRateComparison:
    before: PassRate
    after: PassRate
    gain: float  # after - before, in pass-rate points (0..1)
    gain_ci_low: float
    gain_ci_high: float
    p_value: float  # two-sided, H0: equal per-problem pass rates
    problems: int

    def as_dict(self) -> dict:
        return asdict(self)


def per_problem_rates(rows: Iterable[dict]) -> dict[str, tuple[float, int]]:
    """problem id -> (pass rate over its samples, sample count), from rollout rows (``outcome`` passed: every
    test passed, whatever the training reward was)."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        sums[r["problem_id"]] += float(r["outcome"] == "passed")
        counts[r["problem_id"]] += 1
    return {p: (sums[p] / counts[p], counts[p]) for p in sums}


def pass_rate(rows: Iterable[dict], confidence: float = 0.95) -> PassRate:
    rows = list(rows)
    if not rows:
        raise ValueError("no samples to compute a pass rate from")
    passed = np.array([float(r["outcome"] == "passed") for r in rows])
    clusters = np.unique([r["problem_id"] for r in rows], return_inverse=True)[1]
    est, se, g = ratio_estimate_se(passed, clusters=clusters)
    z = normal_quantile(0.5 + confidence / 2)
    return PassRate(est, max(0.0, est - z * se), min(1.0, est + z * se), g, len(rows))


def compare_pass_rates(before: Iterable[dict], after: Iterable[dict], confidence: float = 0.95
                       ) -> PassRateComparison:
    """Paired per problem; only problems both policies sampled count (they normally are the same set)."""
    before, after = list(before), list(after)
    a, b = per_problem_rates(after), per_problem_rates(before)
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError("the two rollouts share no problem: nothing to compare")
    d = paired_difference(np.array([a[p][0] for p in common]), np.array([b[p][0] for p in common]),
                          confidence=confidence)
    no_spread = 1.0 if d.diff == 0 else 0.0  # every problem moved by the same amount
    p_value = min(1.0, 2 * normal_sf(abs(d.diff) / d.se)) if d.se > 0 else no_spread
    keep = set(common)
    return PassRateComparison(
        before=pass_rate([r for r in before if r["problem_id"] in keep], confidence),
        after=pass_rate([r for r in after if r["problem_id"] in keep], confidence),
        gain=d.diff, gain_ci_low=d.ci_low, gain_ci_high=d.ci_high, p_value=p_value, problems=len(common))
