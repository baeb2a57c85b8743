"""What a run shows people: the eval report as markdown, ingest counts as table rows, the loss curve as PNG.

Plain functions (no Prefect, no MLflow) so the flows publish the same content to both UIs.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any


def eval_report_markdown(title: str, scores: Mapping[str, float], gate: Mapping[str, Any] | None,
                         links: Mapping[str, str],
                         costs: Mapping[str, tuple[str, Mapping[str, float]]] | None = None,
                         skipped: Mapping[str, str] | None = None) -> str:
    """Scores with their 95% CIs, the suites that did not apply to the model (``skipped``: suite -> reason),
    the gate verdict with both noise components and the MDE per metric, where to look next, and (last) one
    cost line per stage: ``costs`` = stage -> (status, cost)."""
    lines = [f"# {title}", "", "| metric | value | 95% CI |", "|---|---|---|"]
    for key in sorted(k for k in scores if "_ci_" not in k):
        low, high = scores.get(f"{key}_ci_low"), scores.get(f"{key}_ci_high")
        ci = f"{low:.4f} - {high:.4f}" if low is not None and high is not None else ""
        lines.append(f"| {key} | {scores[key]:.4f} | {ci} |")
    lines.append("")
    if skipped:
        lines += [f"- suite {suite} skipped: {reason}" for suite, reason in sorted(skipped.items())] + [""]
    if gate:
        lines += [f"**Gate verdict: {gate['verdict']}** ({gate.get('reason', '')}); "
                  f"{gate.get('registered_model')}@{gate.get('alias')} = version {gate.get('champion_version')}", ""]
        lines += gate_noise_table(gate)
    else:
        lines += ["Gate: not run.", ""]
    lines += [f"- {name}: {url}" for name, url in links.items()]
    if costs:
        lines += ["", *cost_section(costs)]
    return "\n".join(lines)


def cost_section(costs: Mapping[str, tuple[str, Mapping[str, float]]]) -> list[str]:
    """"## Cost per stage": one line per stage (wall, CPU-seconds, GPU-seconds; skipped ones cost nothing) and
    the run's total, as a code block so the columns line up."""
    from codemill.cost import cost_line, total

    spent = total({k: c for k, (status, c) in costs.items() if status == "ran"})
    return ["## Cost per stage", "", "```", *(cost_line(stage, status, cost) for stage, (status, cost) in
                                            costs.items()),
            f"{'total':<18} {'':<8} wall {spent['wall_s']:7.1f} s  CPU {spent['cpu_s']:7.1f} s  "
            f"GPU {spent['gpu_s']:6.1f} s", "```"]


def gate_noise_table(gate: Mapping[str, Any]) -> list[str]:
    """The gate's evidence per metric: the difference, the item-level SE, the seed SD (or "uncalibrated"), the
    total SE the tests used, both p-values and the minimum detectable effect at 80% power."""
    metrics = gate.get("metrics") or []
    if not metrics:
        return []
    lines = ["| metric | diff (+ = better) | SE item | seed SD (n) | SE total | p worse | p better "
             "| MDE better | MDE worse |", "|---|---|---|---|---|---|---|---|---|"]
    for m in metrics:
        seed = f"{m['seed_sd']:.4f} ({m['n_seeds']})" if m.get("calibrated") else "uncalibrated"
        lines.append(f"| {m['metric']} | {m['diff']:+.4f} | {m.get('se_item', m['se']):.4f} | {seed} | {m['se']:.4f} "
                     f"| {m['p_regression_holm']:.3g} | {m['p_improvement_holm']:.3g} | {m.get('mde', 0.0):.4f} "
                     f"| {m.get('mde_worse', 0.0):.4f} |")
    if not gate.get("calibrated"):
        lines.append(f"\n**uncalibrated**: no seed noise for the champion's recipe (`"
                     f"{gate.get('calibrate_advice', 'codemill calibrate')}`); differences below the hold margin "
                     "count as none.")
    lines.append("\nSE total = sqrt(SE item^2 + 2 x seed SD^2) (a candidate averaged over N seeds: + its seeds' "
                 "SD^2 / N in place of one seed SD^2); MDE: the smallest true difference detected with "
                 "80% power (one-sided, alpha / number of metrics).")
    return [*lines, ""]


LOG_WIDTH = 80


def unit_of(metric: str) -> str:
    """The unit a metric's values are in, by its name (``_ms``: milliseconds); "" for scores and rates."""
    return " ms" if metric.endswith("_ms") else ""


def metric_lines(m: Mapping[str, Any], a: str = "candidate", b: str = "champion") -> list[str]:
    """One gate metric as six lines under 80 columns (for logs and terminals; --json has everything)."""
    u = unit_of(m["metric"])
    direction = f"+ = {a} better" + ("; ms, lower is faster" if u else "")
    seed = (f"seed SD {m['seed_sd']:.4f} ({m['n_seeds']} seeds)" if m.get("calibrated")
            else f"uncalibrated (hold below {m.get('hold_margin', 0.0):.3g})")
    if m.get("candidate_seeds", 1) > 1:
        own = m.get("candidate_seed_sd")
        seed += f"; {a}: mean of {m['candidate_seeds']}" + (f", SD {own:.4f}" if own is not None else "")
    df = f"   df {m['df']:.1f}" if m.get("df") else ""
    return [f"{m['metric']} ({direction})",
            f"  {a} {m['candidate']:.4f}{u}   {b} {m['champion']:.4f}{u}   diff {m['diff']:+.4f}{u}",
            f"  95% CI [{m['ci_low']:+.4f}, {m['ci_high']:+.4f}]   SE total {m['se']:.4f}{df}",
            f"  SE item {m.get('se_item', m['se']):.4f}   {seed}",
            f"  p worse {m['p_regression']:.3g} (Holm {m['p_regression_holm']:.3g})   p better "
            f"{m['p_improvement']:.3g} (Holm {m['p_improvement_holm']:.3g})",
            f"  MDE (80% power) better {m.get('mde', 0.0):.4f}, worse {m.get('mde_worse', 0.0):.4f}   "
            f"items {m['n_items']}, clusters {m['n_clusters']}"]


def comparison_text(result: Mapping[str, Any]) -> str:
    """``codemill compare`` for an 80-column log: the two models, the verdict, then each metric."""
    lines = [f"a (candidate): {result['model_a']}", f"b (reference): {result['model_b']}",
             "paired on the same eval items", "",
             f"verdict: {result['verdict']} (alpha {result['alpha']}, Holm-corrected)",
             *textwrap.wrap(f"reason: {result['reason']}", LOG_WIDTH, subsequent_indent="  "), ""]
    if result.get("calibration"):
        lines += textwrap.wrap(f"noise: calibrated ({result['calibration']})", LOG_WIDTH, subsequent_indent="  ")
    else:
        lines.append("noise: uncalibrated (item-level SE only; no seed noise for b's recipe)")
    if result.get("latency"):
        lines += ["", *latency_table(result["latency"])]
    for m in result["metrics"]:
        lines += ["", *metric_lines(m, "a", "b")]
    return "\n".join(lines)


LATENCY_ROWS = (("TTFT p50", "latency_ttft_p50_ms", "ms"), ("TTFT p95", "latency_ttft_p95_ms", "ms"),
                ("per token p50", "latency_per_token_p50_ms", "ms"),
                ("per token p95", "latency_per_token_p95_ms", "ms"), ("tokens/s", "latency_tokens_per_s", ""))


def latency_table(lat: Mapping[str, Any]) -> list[str]:
    """Two checkpoints' latency side by side (lower is better but for tokens/s), and where it was measured."""
    on = lat.get("on") or {}
    head = (f"latency, batch 1, {lat.get('prompts')} prompts x {lat.get('new_tokens')} new tokens, same machine: "
            f"{on.get('device')} {on.get('dtype')}, {on.get('engine')} {on.get('engine_version')}, "
            f"{on.get('threads')} threads")
    lines = [*textwrap.wrap(head, LOG_WIDTH, subsequent_indent="  "), f"  {'':<16}{'a':>12}{'b':>12}{'a / b':>10}"]
    for label, key, unit in LATENCY_ROWS:
        va, vb = lat["a"].get(key), lat["b"].get(key)
        if va is None or vb is None:
            continue
        ratio = f"{va / vb:>10.2f}" if vb else f"{'-':>10}"
        lines.append(f"  {(label + (' ' + unit if unit else '')):<16}{va:>12.3f}{vb:>12.3f}{ratio}")
    return lines


def latency_line(scores: Mapping[str, Any], device: str | None = None) -> str | None:
    """The run summary's latency line, p50/p95 (None when the suite did not run); wrap it at 80 columns."""
    s = scores
    if "latency_ttft_p50_ms" not in s:
        return None
    line = f"latency p50/p95: TTFT {s['latency_ttft_p50_ms']:.2f}/{s['latency_ttft_p95_ms']:.2f} ms"
    if "latency_per_token_p50_ms" in s:
        line += f", per token {s['latency_per_token_p50_ms']:.2f}/{s['latency_per_token_p95_ms']:.2f} ms"
    return line + f", {s['latency_tokens_per_s']:.0f} tok/s" + (f" on {device}" if device else "")


def skipped_suites(stages: Mapping[str, Any]) -> dict[str, str]:
    """Suite -> why it did not apply to the model, from a flow result's ``stages`` (``eval:<suite>`` steps whose
    summary says ``skipped``); the steps are StageResults or their JSON dumps."""
    out = {}
    for key, st in stages.items():
        summary = st.get("summary") if isinstance(st, Mapping) else getattr(st, "summary", None)
        if key.startswith("eval:") and summary and summary.get("skipped"):
            out[key.removeprefix("eval:")] = str(summary["skipped"])
    return out


def summary_lines(out: Mapping[str, Any], wall_s: float) -> list[str]:
    """The run summary for an 80-column log: one line per stage (status, cost, artifact), the scores, the
    gate with each metric's noise, where to look."""
    lines = [f"codemill finished in {wall_s:.1f}s", "",
             f"{'stage':<20}{'status':<10}{'wall s':>8}{'CPU s':>8}{'GPU s':>7}  artifact (in the store)"]
    for name, st in out["stages"].items():
        status = {"cached": "cached", "present": "in store"}.get(st["status"], "ran")
        cost = (st.get("cost") or {}) if status == "ran" else {}
        nums = "".join(f"{cost[k]:>{w}.1f}" if k in cost else f"{'-':>{w}}"
                       for k, w in (("wall_s", 8), ("cpu_s", 8), ("gpu_s", 7)))
        ref = st["ref"]
        lines.append(f"{name[:19]:<20}{status:<10}{nums}  {ref['name']}-{ref['digest'][:12]}")
    s = out["scores"]
    lines.append("")
    for key in sorted(k for k in s if "_ci_" not in k and not k.startswith("latency_")):
        ci = f" (95% CI {s[key + '_ci_low']:.4f} - {s[key + '_ci_high']:.4f})" if f"{key}_ci_low" in s else ""
        lines.append(f"{key}: {s[key]:.4f}{ci}")
    latency = latency_line(s, ((out["stages"].get("eval:latency") or {}).get("summary") or {}).get("device"))
    if latency:
        lines += textwrap.wrap(latency, LOG_WIDTH, subsequent_indent="  ")
    for suite, reason in sorted(skipped_suites(out["stages"]).items()):
        lines += textwrap.wrap(f"{suite}: skipped ({reason})", LOG_WIDTH, subsequent_indent="  ")
    g = out.get("gate")
    if g:
        lines += ["", *textwrap.wrap(f"gate: {g['verdict']} ({g['reason']}); {g['registered_model']}@{g['alias']} = "
                                     f"version {g['champion_version']}", LOG_WIDTH, subsequent_indent="  ")]
        if g.get("calibration"):
            lines += textwrap.wrap(f"noise: {g['calibration']}", LOG_WIDTH, subsequent_indent="  ")
        for m in g.get("metrics") or []:
            lines += metric_lines(m)
        if g.get("metrics") and not g.get("calibrated"):
            lines += textwrap.wrap(calibrate_advice(g.get("calibrate_advice", "codemill calibrate --seeds 10"),
                                                    out["stages"]), LOG_WIDTH, subsequent_indent="  ")
    return lines


# The per-iteration columns of ``codemill rl``: (heading, row key, width, format). "signal" is the share of groups
# whose rewards differ: GRPO learns only from those (the others have zero advantage). "turns" is the mean number
# of policy turns per episode, "obs" the share of tokens after the prompt that the environment wrote (no loss).
# "rollout s" is the rollouts' wall time: generation (several batches at once) and judging overlap, so their own
# sums (in the MLflow run and the flow's result) can exceed it.
RL_COLUMNS = (("iter", "iteration", 4, "d"), ("reward", "reward_mean", 7, ".3f"),
              ("pass", "pass_rate", 6, ".3f"), ("signal", "signal_groups", 7, ".2f"), ("kl", "kl", 8, ".4f"),
              ("tokens", "response_tokens_mean", 7, ".1f"), ("turns", "turns_mean", 6, ".2f"),
              ("obs", "observed_token_frac", 5, ".2f"), ("rollout s", "rollout_wall_s", 10, ".1f"),
              ("update s", "update_s", 9, ".1f"))
LEARNABLE_SHARE_TARGET = 0.2


def rl_summary_lines(out: Mapping[str, Any], wall_s: float) -> list[str]:
    """``codemill rl``'s summary for an 80-column log: one row per iteration, the held-out pass rate before and
    after with the CI of the gain, and one warning line when no group ever had a learnable signal."""
    rows = out["iterations"]
    lines = [f"codemill rl: {len(rows)} iterations in {wall_s:.1f}s", "",
             "".join(f"{h:>{w}}" for h, _, w, _ in RL_COLUMNS)]
    for r in rows:
        lines.append("".join(f"{'-':>{w}}" if r.get(k) is None else f"{r[k]:>{w}{f}}" for _, k, w, f in RL_COLUMNS))
    lines += textwrap.wrap(f"signal: share of groups whose rewards differ, what GRPO learns from (aim for >= "
                           f"{LEARNABLE_SHARE_TARGET:.0%})", LOG_WIDTH, subsequent_indent="  ")
    if rows and all(r.get("signal_groups") == 0 for r in rows):
        lines.append("no learnable signal: every group had equal rewards (try rl.warm_start or an easier set)")
    h = out["heldout"]
    lines += ["", *textwrap.wrap(
        f"held-out pass rate: {h['before']['rate']:.3f} -> {h['after']['rate']:.3f} (gain {h['gain']:+.3f}, "
        f"95% CI [{h['gain_ci_low']:+.3f}, {h['gain_ci_high']:+.3f}], p={h['p_value']:.3g}, "
        f"{h['problems']} problems)", LOG_WIDTH, subsequent_indent="  ")]
    if out.get("gate"):
        lines.append(f"gate: {out['gate']['verdict']}")
    lines += textwrap.wrap(f"final policy: LoggedModel {out['model_id']}; MLflow parent run "
                           f"{out['parent_run_id']}", LOG_WIDTH, subsequent_indent="  ")
    return lines


def calibrate_advice(command: str, stages: Mapping[str, Any]) -> str:
    """One line: what to run for a calibrated verdict and about how long it takes, estimated from what this
    run's training and evaluations cost (when they ran here)."""
    import re

    seeds = int(m.group(1)) if (m := re.search(r"--seeds (\d+)", command)) else 10
    ran = {k: st for k, st in stages.items() if k == "train" or k.startswith("eval:")}
    walls = [float(w) for st in ran.values() if st.get("status") == "ran"
             and (w := (st.get("cost") or {}).get("wall_s")) is not None]
    cost = (f"about {max(1, round(seeds * sum(walls) / 60))} min here" if "train" in ran and len(walls) == len(ran)
            else f"{seeds} x train + eval")
    return f"to calibrate: {command} ({cost})"


def calibration_lines(out: Mapping[str, Any], wall_s: float) -> list[str]:
    """``codemill calibrate`` for an 80-column log: per metric the seed SD, item SE, SE of a comparison and
    the MDE at 80% power, then the cost of each stage."""
    from codemill.cost import cost_line

    lines = [f"codemill calibrate finished in {wall_s:.1f}s: recipe {out['recipe_key'][:12]}, "
             f"seeds {out['seeds']}", *textwrap.wrap(f"artifact: {out['calibration']}", LOG_WIDTH), "",
             f"{'metric':<27}{'seed SD':>9}{'item SE':>9}{'SE cmp':>9}{'MDE +':>9}{'MDE -':>9}"]
    for r in out["metrics"]:
        lines.append(f"{r['metric'][:26]:<27}{r['seed_sd']:>9.4f}{r['item_se']:>9.4f}{r['se_total']:>9.4f}"
                     f"{r['mde_better']:>9.4f}{r['mde_worse']:>9.4f}")
    lines += ["SE cmp = sqrt(item SE^2 + 2 seed SD^2): a comparison of two trainings; MDE +/-: the",
              f"smallest improvement / regression the gate detects with 80% power (alpha {out['alpha']}).", "",
              "cost:"]
    lines += [cost_line(k, st["status"], st.get("cost")) for k, st in out["stages"].items()]
    lines.append(f"registered model {out['registered_model']}; MLflow run {out['parent_run_id']}")
    return lines


def ingest_table(stats: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per counted outcome of the ingest stage: kept, each rejection reason (duplicates included),
    redactions by kind, decontamination drops."""
    rows = [{"count": "files seen", "value": stats.get("files_seen")},
            {"count": "files kept", "value": stats.get("files_kept")}]
    rows += [{"count": f"rejected: {reason}", "value": n}
             for reason, n in sorted((stats.get("rejected_by_reason") or {}).items())]
    rows.append({"count": "files redacted", "value": stats.get("redacted_files")})
    for kind, n in sorted((stats.get("redactions") or {}).items()):
        rows.append({"count": f"redacted: {kind}", "value": n})
    dropped = (stats.get("decontamination") or {}).get("dropped")
    if dropped is not None:
        rows.append({"count": "decontaminated", "value": len(dropped)})
    return [r for r in rows if r["value"] is not None]


def loss_curve_png(losses: Sequence[float], val_losses: Mapping[int, float] | Mapping[str, float] | None = None,
                   title: str = "training loss") -> bytes:
    """Train loss per step (and val loss at checkpoints) as a small PNG. `val_losses` keys may be strings: a
    training summary read back from JSON."""
    lines: dict[str, tuple[Sequence[float], Sequence[float], str]] = {
        "train": ([float(i) for i in range(1, len(losses) + 1)], list(losses), "-")}
    if val_losses:
        points = sorted((int(step), loss) for step, loss in val_losses.items())
        lines["val"] = ([step for step, _ in points], [loss for _, loss in points], "o-")
    return lines_png(lines, "step", "loss (nats/token)", title)


def reward_curve_png(iterations: Sequence[Mapping[str, Any]], heldout: Any = None) -> bytes:
    """RL per iteration: train reward mean and pass rate of the rollouts, and the held-out pass rate of the
    starting and the final policy (with their confidence intervals) when given."""
    xs: list[float] = [float(r["iteration"]) for r in iterations]
    lines = {"rollout reward (mean)": (xs, [float(r["reward_mean"]) for r in iterations], "o-"),
             "rollout pass rate": (xs, [float(r["pass_rate"]) for r in iterations], "s--")}
    if heldout is not None and xs:
        ends: list[float] = [xs[0] - 0.5, xs[-1] + 0.5]
        lines["held-out pass rate"] = (ends, [heldout.before.rate, heldout.after.rate], "D:")
    return lines_png(lines, "iteration", "reward / pass rate", "RL: reward per iteration")


def lines_png(lines: Mapping[str, tuple[Sequence[float], Sequence[float], str]], xlabel: str, ylabel: str,
              title: str) -> bytes:
    """A small PNG of named (x, y, style) lines."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5), dpi=90)
    ax = fig.add_subplot()
    for label, (xs, ys, style) in lines.items():
        ax.plot(xs, ys, style, label=label, linewidth=1.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
