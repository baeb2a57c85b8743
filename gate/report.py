"""A gate verdict as markdown: the verdict and reason, where the noise came from, one row per metric with both
noise components, McNemar's counts for pass/fail metrics and the MDE. The gate task logs it on the run and shows
it in Prefect."""

from __future__ import annotations

from codemill.gate.policy import GateVerdict

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
    """The verdict ``v`` under the heading ``title``."""
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
                 "seeds (alpha / number of metrics, one-sided; see codemill.gate.noise).")
    return "\n".join(lines) + "\n"
