"""The gate's policy: given the evidence (``evidence.collect``), is the candidate worse than the champion?

For each metric, with per-item paired differences d (oriented so positive = candidate better), a
cluster-robust item-level SE and, when the champion's config was calibrated (``codemill calibrate``), twice its
between-seed variance (``gate.noise``: SE^2 = SE_item^2 + 2 s2, Student t with Satterthwaite df):
- regression test, H0: D >= -margin vs H1: D < -margin (candidate worse by more than the margin);
- improvement test, H0: D <= 0 vs H1: D > 0.
Holm's correction runs across metrics within each family. Verdict: ``regression`` if any metric's corrected
regression p < alpha; else ``promote`` if any corrected improvement p < alpha; else ``hold``. Uncalibrated, the
seed noise is unknown: a metric whose |diff| is below its hold margin (the noise source's, else the metric's
floor) counts as neither worse nor better, and the reason says "uncalibrated" and names the command that
calibrates (the advice line).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from codemill.evals.stats import ItemScores, PairedDifference, holm, mcnemar_exact, paired_difference
from codemill.gate.evidence import Evidence, NoiseSource
from codemill.gate.noise import SeedNoise, detectable, noise_model, one_sided_pvalues, t_quantile


@dataclass
class MetricEvidence(PairedDifference):
    """The paired difference of one metric plus the two tests' p-values (flat, so it reads well as JSON).

    ``se`` (and the CI) is the total SE the tests use: ``sqrt(se_item^2 + 2 seed_sd^2)`` for two single
    trainings (``gate.noise.NoiseModel`` for a candidate that is the mean of several seeds)."""

    metric: str
    candidate: float
    champion: float
    margin: float
    p_regression: float
    p_improvement: float
    p_regression_holm: float = 1.0
    p_improvement_holm: float = 1.0
    mcnemar: dict | None = None
    se_item: float = 0.0
    seed_sd: float = 0.0
    n_seeds: int = 0
    df: float | None = None  # Student t degrees of freedom of the tests; None = normal (no seed noise)
    calibrated: bool = False
    hold_margin: float = 0.0
    mde: float = 0.0  # smallest true improvement promoted with 80% power
    mde_worse: float = 0.0  # smallest true decline flagged as a regression with 80% power
    candidate_seeds: int = 1  # models averaged into the candidate's value (train.seeds)
    candidate_seed_sd: float | None = None  # their spread, when measured apart from the champion's seed SD


@dataclass
class GateVerdict:
    verdict: str
    alpha: float
    reason: str
    metrics: list[MetricEvidence] = field(default_factory=list)
    calibrated: bool = False
    calibration: str | None = None  # where the seed noise came from (the calibration artifact)

    def as_dict(self) -> dict:
        return asdict(self)


def _align(a: ItemScores, b: ItemScores) -> tuple[np.ndarray, np.ndarray]:
    common, ia, ib = np.intersect1d(a.item_ids, b.item_ids, return_indices=True)
    if common.size == 0:
        raise ValueError("candidate and champion share no items: a paired comparison is impossible")
    return ia, ib


def compare_metric(name: str, cand: ItemScores, champ: ItemScores, margin: float, noise: SeedNoise | None = None,
                   alpha: float = 0.05, n_metrics: int = 1, uncalibrated_margin: float | None = None,
                   confidence: float = 0.95, run_noise: SeedNoise | None = None,
                   candidate_seeds: int = 1) -> MetricEvidence:
    ia, ib = _align(cand, champ)
    cv, cw, clusters = cand.values[ia], cand.weights[ia], cand.clusters[ia]
    hv = champ.values[ib]
    pd = paired_difference(cv, hv, weights=cw, clusters=clusters, higher_is_better=cand.higher_is_better)
    nm = noise_model(name, pd.se, noise, uncalibrated_margin, run_noise, candidate_seeds)
    se, df = nm.se, nm.df
    half = t_quantile(0.5 + confidence / 2, df) * se
    p_reg, p_imp = one_sided_pvalues(pd.diff, se, df, margin)
    mde_better, mde_worse = detectable(nm, alpha, n_metrics, margin)
    ev = MetricEvidence(diff=pd.diff, se=se, ci_low=pd.diff - half, ci_high=pd.diff + half, n_items=pd.n_items,
                        n_clusters=pd.n_clusters, metric=name, candidate=float(cv.sum() / cw.sum()),
                        champion=float(hv.sum() / cw.sum()), margin=margin, p_regression=p_reg, p_improvement=p_imp,
                        se_item=pd.se, seed_sd=nm.seed_var**0.5, n_seeds=nm.n_seeds,
                        df=None if math.isinf(df) else df, calibrated=nm.calibrated,
                        hold_margin=nm.hold_margin, mde=mde_better, mde_worse=mde_worse,
                        candidate_seeds=candidate_seeds,
                        candidate_seed_sd=None if nm.cand_var is None else nm.cand_var**0.5)
    if cand.binary:
        only_c, only_h, p = mcnemar_exact(cv > 0.5, hv > 0.5)
        ev.mcnemar = {"only_candidate_passed": only_c, "only_champion_passed": only_h, "p_two_sided": p}
    return ev


def decide(evidence: Evidence, alpha: float = 0.05) -> GateVerdict:
    """Promote, hold or regression, with the reason. A calibrated metric is tested with the reference's
    between-seed noise (``evidence.noise.metrics``); an uncalibrated one on the item SE alone, with differences
    below its hold margin counted as none: its own ``uncalibrated_margin``, else the noise source's hold margin,
    else its floor. A candidate of several seeds is charged its own spread (``gate.noise.noise_model``)."""
    source, seeds = evidence.noise, evidence.candidate_seeds
    tests = [compare_metric(m.name, evidence.candidate[m.name], evidence.reference[m.name], m.margin,
                            source.metrics.get(m.name), alpha, len(evidence.metrics),
                            m.uncalibrated_margin if m.uncalibrated_margin is not None
                            else source.hold_margins.get(m.name), run_noise=evidence.run_noise.get(m.name),
                            candidate_seeds=seeds) for m in evidence.metrics]
    return _verdict(tests, alpha, source, seeds)


def _verdict(evidence: list[MetricEvidence], alpha: float, source: NoiseSource, candidate_seeds: int) -> GateVerdict:
    """The Holm-corrected tests' verdict and its reason (with the advice line when uncalibrated)."""
    calibration = source.uri if source.metrics else None
    for ev, adj in zip(evidence, holm([e.p_regression for e in evidence]), strict=True):
        ev.p_regression_holm = adj
    for ev, adj in zip(evidence, holm([e.p_improvement for e in evidence]), strict=True):
        ev.p_improvement_holm = adj
    worse = [e.metric for e in evidence if e.p_regression_holm < alpha and e.diff < -e.hold_margin]
    better = [e.metric for e in evidence if e.p_improvement_holm < alpha and e.diff > e.hold_margin]
    uncalibrated = [e for e in evidence if not e.calibrated]
    note = ""
    if uncalibrated:
        held = [e.metric for e in uncalibrated if abs(e.diff) <= e.hold_margin]
        origin = f" (from preset {source.hold_margins_from}'s seed noise)" if source.hold_margins_from else ""
        note = (f"; uncalibrated: needs `{source.advice}` (no seed noise for the champion's recipe on "
                f"{[e.metric for e in uncalibrated]}), so differences below the hold margin{origin} count as none"
                + (f" (held: {held})" if held else ""))
    if candidate_seeds > 1:
        note += f"; the candidate is the mean of {candidate_seeds} seeds' models"
    calibrated = not uncalibrated
    if worse:
        return GateVerdict("regression", alpha, f"worse than the champion by more than the margin on {worse}"
                           + note, evidence, calibrated, calibration)
    if better:
        return GateVerdict("promote", alpha, f"better than the champion on {better}, no metric worse" + note,
                           evidence, calibrated, calibration)
    return GateVerdict("hold", alpha, "no significant difference from the champion" + note, evidence, calibrated,
                       calibration)
