"""The regression gate: is a candidate model worse than the champion on the same items?

For each metric, with per-item paired differences d (oriented so positive = candidate better) and a
cluster-robust SE:
- regression test, H0: D >= -margin vs H1: D < -margin (candidate worse by more than the margin);
- improvement test, H0: D <= 0 vs H1: D > 0.
Holm's correction runs across metrics within each family. Verdict: ``regression`` if any metric's corrected
regression p < alpha; else ``promote`` if any corrected improvement p < alpha; else ``hold``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from codemill.evals.stats import PairedDifference, holm, mcnemar_exact, normal_sf, paired_difference


@dataclass(frozen=True)
class ItemScores:
    """One metric's per-item values for one model: the metric is sum(values) / sum(weights)."""

    item_ids: np.ndarray
    values: np.ndarray
    weights: np.ndarray
    clusters: np.ndarray
    higher_is_better: bool
    binary: bool = False  # per-item pass/fail (greedy pass@1): McNemar applies


@dataclass(frozen=True)
class GateMetric:
    name: str
    margin: float = 0.0


@dataclass
class MetricEvidence(PairedDifference):
    """The paired difference of one metric plus the two tests' p-values (flat, so it reads well as JSON)."""

    metric: str
    candidate: float
    champion: float
    margin: float
    p_regression: float
    p_improvement: float
    p_regression_holm: float = 1.0
    p_improvement_holm: float = 1.0
    mcnemar: dict | None = None


@dataclass
class GateVerdict:
    verdict: str
    alpha: float
    reason: str
    metrics: list[MetricEvidence] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _align(a: ItemScores, b: ItemScores) -> tuple[np.ndarray, np.ndarray]:
    common, ia, ib = np.intersect1d(a.item_ids, b.item_ids, return_indices=True)
    if common.size == 0:
        raise ValueError("candidate and champion share no items: a paired comparison is impossible")
    return ia, ib


def _one_sided(diff: float, se: float, margin: float) -> tuple[float, float]:
    if se == 0.0:
        return (0.0 if diff < -margin else 1.0), (0.0 if diff > 0 else 1.0)
    return 1.0 - normal_sf((diff + margin) / se), normal_sf(diff / se)


def compare_metric(name: str, cand: ItemScores, champ: ItemScores, margin: float) -> MetricEvidence:
    ia, ib = _align(cand, champ)
    cv, cw, clusters = cand.values[ia], cand.weights[ia], cand.clusters[ia]
    hv = champ.values[ib]
    pd = paired_difference(cv, hv, weights=cw, clusters=clusters, higher_is_better=cand.higher_is_better)
    p_reg, p_imp = _one_sided(pd.diff, pd.se, margin)
    ev = MetricEvidence(**asdict(pd), metric=name, candidate=float(cv.sum() / cw.sum()),
                        champion=float(hv.sum() / cw.sum()), margin=margin, p_regression=p_reg, p_improvement=p_imp)
    if cand.binary:
        only_c, only_h, p = mcnemar_exact(cv > 0.5, hv > 0.5)
        ev.mcnemar = {"only_candidate_passed": only_c, "only_champion_passed": only_h, "p_two_sided": p}
    return ev


def gate(candidate: dict[str, ItemScores], champion: dict[str, ItemScores], metrics: list[GateMetric],
         alpha: float = 0.05) -> GateVerdict:
    missing = [m.name for m in metrics if m.name not in candidate or m.name not in champion]
    if missing:
        raise ValueError(f"metrics missing from an evaluation: {missing}")
    evidence = [compare_metric(m.name, candidate[m.name], champion[m.name], m.margin) for m in metrics]
    for ev, adj in zip(evidence, holm([e.p_regression for e in evidence]), strict=True):
        ev.p_regression_holm = adj
    for ev, adj in zip(evidence, holm([e.p_improvement for e in evidence]), strict=True):
        ev.p_improvement_holm = adj
    worse = [e.metric for e in evidence if e.p_regression_holm < alpha]
    better = [e.metric for e in evidence if e.p_improvement_holm < alpha]
    if worse:
        return GateVerdict("regression", alpha, f"worse than the champion by more than the margin on {worse}",
                           evidence)
    if better:
        return GateVerdict("promote", alpha, f"better than the champion on {better}, no metric worse", evidence)
    return GateVerdict("hold", alpha, "no significant difference from the champion", evidence)


def markdown_report(v: GateVerdict, title: str) -> str:
    lines = [f"# {title}", "", f"**Verdict: {v.verdict}** — {v.reason} (alpha {v.alpha}, Holm-corrected)", "",
             "| metric | candidate | champion | diff (+ = better) | 95% CI | items | clusters | margin "
             "| p worse (Holm) | p better (Holm) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for e in v.metrics:
        lines.append(f"| {e.metric} | {e.candidate:.4f} | {e.champion:.4f} | {e.diff:+.4f} | "
                     f"[{e.ci_low:+.4f}, {e.ci_high:+.4f}] | {e.n_items} | {e.n_clusters} | {e.margin} | "
                     f"{e.p_regression_holm:.3g} | {e.p_improvement_holm:.3g} |")
    for e in v.metrics:
        if e.mcnemar:
            lines.append(f"\nMcNemar ({e.metric}): only candidate passed {e.mcnemar['only_candidate_passed']}, "
                         f"only champion passed {e.mcnemar['only_champion_passed']}, "
                         f"p = {e.mcnemar['p_two_sided']:.3g}")
    return "\n".join(lines) + "\n"
