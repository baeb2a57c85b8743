"""The regression gate: is a candidate model worse than the champion on the same items?

For each metric, with per-item paired differences d (oriented so positive = candidate better), a
cluster-robust item-level SE and, when the champion's config was calibrated (``codemill calibrate``), twice its
between-seed variance (``evals.noise``: SE^2 = SE_item^2 + 2 s2, Student t with Satterthwaite df):
- regression test, H0: D >= -margin vs H1: D < -margin (candidate worse by more than the margin);
- improvement test, H0: D <= 0 vs H1: D > 0.
Holm's correction runs across metrics within each family. Verdict: ``regression`` if any metric's corrected
regression p < alpha; else ``promote`` if any corrected improvement p < alpha; else ``hold``. Uncalibrated, the
seed noise is unknown: a metric whose |diff| is below its default hold margin (``evals.noise``) counts as
neither worse nor better, and the reason says "uncalibrated".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from codemill.evals.noise import SeedNoise, detectable, noise_model, one_sided_pvalues, t_quantile
from codemill.evals.stats import ItemScores, PairedDifference, holm, mcnemar_exact, paired_difference


@dataclass(frozen=True)
class GateMetric:
    name: str
    margin: float = 0.0
    uncalibrated_margin: float | None = None  # None: evals.noise's documented default for the metric


@dataclass
class MetricEvidence(PairedDifference):
    """The paired difference of one metric plus the two tests' p-values (flat, so it reads well as JSON).

    ``se`` (and the CI) is the total SE the tests use: ``sqrt(se_item^2 + 2 seed_sd^2)`` for two single
    trainings (``evals.noise.NoiseModel`` for a candidate that is the mean of several seeds)."""

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


def gate(candidate: dict[str, ItemScores], champion: dict[str, ItemScores], metrics: list[GateMetric],
         alpha: float = 0.05, noise: dict[str, SeedNoise] | None = None,
         calibration: str | None = None, hold_margins: dict[str, float] | None = None,
         advice: str = "codemill calibrate", run_noise: dict[str, SeedNoise] | None = None,
         candidate_seeds: int = 1, margins_from: str | None = None) -> GateVerdict:
    """``noise``: the champion config's between-seed noise per metric (None or a missing metric: uncalibrated,
    tested on the item SE alone with differences below the metric's hold margin counted as none).
    ``hold_margins``: the uncalibrated hold margin per metric (``evals.preset_noise.hold_margins``); a metric's
    own ``uncalibrated_margin`` wins, a metric in neither gets the floor of ``evals.noise``. ``advice``: the
    command that would calibrate the champion's config, named in the reason of an uncalibrated verdict.
    ``candidate_seeds`` > 1: ``candidate`` is the mean of that many seeds' scores and ``run_noise`` their
    spread, each charged to its own training (``evals.noise.noise_model``). ``margins_from``: the preset whose
    noise the hold margins were derived from, named in the reason."""
    missing = [m.name for m in metrics if m.name not in candidate or m.name not in champion]
    if missing:
        raise ValueError(f"metrics missing from an evaluation: {missing}")
    noise = noise or {}
    margins = hold_margins or {}
    evidence = [compare_metric(m.name, candidate[m.name], champion[m.name], m.margin, noise.get(m.name), alpha,
                               len(metrics), m.uncalibrated_margin if m.uncalibrated_margin is not None
                               else margins.get(m.name), run_noise=(run_noise or {}).get(m.name),
                               candidate_seeds=candidate_seeds) for m in metrics]
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
        origin = f" (from preset {margins_from}'s seed noise)" if margins_from else ""
        note = (f"; uncalibrated: needs `{advice}` (no seed noise for the champion's recipe on "
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


SE_FORMULA = ("SE = sqrt(SE item^2 + 2 x seed SD^2), or sqrt(SE item^2 + seed SD^2 + candidate seed SD^2 / N) "
              "for a candidate that is the mean of N seeds")


def noise_line(v: GateVerdict) -> str:
    """One sentence on where the gate's noise came from."""
    if v.calibrated:
        seeds = sorted({e.n_seeds for e in v.metrics})
        return (f"Noise: calibrated, between-seed variance from {'/'.join(map(str, seeds))} seeds"
                f"{f' ({v.calibration})' if v.calibration else ''}; {SE_FORMULA}.")
    return ("Noise: **uncalibrated** (no seed noise for the champion's recipe): SE is the item-level SE alone, "
            "and a difference smaller than the hold margin counts as none.")


def markdown_report(v: GateVerdict, title: str) -> str:
    lines = [f"# {title}", "", f"**Verdict: {v.verdict}** — {v.reason} (alpha {v.alpha}, Holm-corrected)", "",
             noise_line(v), "",
             "| metric | candidate | champion | diff (+ = better) | 95% CI | SE item | seed SD (n) | SE total "
             "| items | clusters | margin | hold margin | p worse (Holm) | p better (Holm) | MDE better / worse "
             "(80% power) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in v.metrics:
        seed = f"{e.seed_sd:.4f} ({e.n_seeds})" if e.calibrated else "uncalibrated"
        lines.append(f"| {e.metric} | {e.candidate:.4f} | {e.champion:.4f} | {e.diff:+.4f} | "
                     f"[{e.ci_low:+.4f}, {e.ci_high:+.4f}] | {e.se_item:.4f} | {seed} | {e.se:.4f} | {e.n_items} | "
                     f"{e.n_clusters} | {e.margin} | {e.hold_margin} | {e.p_regression_holm:.3g} | "
                     f"{e.p_improvement_holm:.3g} | {e.mde:.4f} / {e.mde_worse:.4f} |")
    for e in v.metrics:
        if e.mcnemar:
            lines.append(f"\nMcNemar ({e.metric}): only candidate passed {e.mcnemar['only_candidate_passed']}, "
                         f"only champion passed {e.mcnemar['only_champion_passed']}, "
                         f"p = {e.mcnemar['p_two_sided']:.3g}")
    lines.append("\nMDE: the smallest true difference the gate reports with 80% probability at these items and "
                 "seeds (alpha / number of metrics, one-sided; see codemill.evals.noise).")
    return "\n".join(lines) + "\n"
