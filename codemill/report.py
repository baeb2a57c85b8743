"""What a run shows people: the eval report as markdown, ingest counts as table rows, the loss curve as PNG.

Plain functions (no Prefect, no MLflow) so the flows publish the same content to both UIs.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from codemill.layout import (
    LOG_WIDTH,
    Column,
    ci,
    first_fitting,
    num,
    relative_to,
    signed,
    table,
    table_in_parts,
    wrap,
)


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
        bounds = ci(low, high) if low is not None and high is not None else ""
        lines.append(f"| {key} | {num(scores[key])} | {bounds} |")
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
        seed = f"{num(m['seed_sd'])} ({m['n_seeds']})" if m.get("calibrated") else "uncalibrated"
        lines.append(f"| {m['metric']} | {signed(m['diff'])} | {num(m.get('se_item', m['se']))} | {seed} "
                     f"| {num(m['se'])} | {m['p_regression_holm']:.3g} | {m['p_improvement_holm']:.3g} "
                     f"| {num(m.get('mde', 0.0))} | {num(m.get('mde_worse', 0.0))} |")
    if not gate.get("calibrated"):
        lines.append(f"\n**uncalibrated**: no seed noise for the champion's recipe (`"
                     f"{gate.get('calibrate_advice', 'codemill calibrate')}`); differences below the hold margin "
                     "count as none.")
    lines.append("\nSE total = sqrt(SE item^2 + 2 x seed SD^2) (a candidate averaged over N seeds: + its seeds' "
                 "SD^2 / N in place of one seed SD^2); MDE: the smallest true difference detected with "
                 "80% power (one-sided, alpha / number of metrics).")
    return [*lines, ""]


def unit_of(metric: str) -> str:
    """The unit a metric's values are in, as its suite declares it (`` ms``); "" for scores and rates."""
    from codemill.evals.suites import METRICS

    known = METRICS.get(metric)
    return f" {known.unit}" if known is not None and known.unit else ""


def reading_of(metric: str) -> str:
    """How to read a metric's difference beyond "+ = better", as its suite declares it; "" when obvious."""
    from codemill.evals.suites import METRICS

    known = METRICS.get(metric)
    return known.reading if known is not None else ""


def metric_lines(m: Mapping[str, Any], a: str = "candidate", b: str = "champion",
                 width: int = LOG_WIDTH) -> list[str]:
    """One gate metric in full (both noise components, p-values, MDE) as six lines, each wrapped at ``width``
    (for logs and terminals; --json has everything)."""
    u, reading = unit_of(m["metric"]), reading_of(m["metric"])
    direction = f"+ = {a} better" + (f"; {reading}" if reading else "")
    seed = (f"seed SD {num(m['seed_sd'])} ({m['n_seeds']} seeds)" if m.get("calibrated")
            else f"uncalibrated (hold below {m.get('hold_margin', 0.0):.3g})")
    if m.get("candidate_seeds", 1) > 1:
        own = m.get("candidate_seed_sd")
        seed += f"; {a}: mean of {m['candidate_seeds']}" + (f", SD {num(own)}" if own is not None else "")
    df = f"   df {m['df']:.1f}" if m.get("df") else ""
    lines = [f"{m['metric']} ({direction})",
             f"  {a} {num(m['candidate'])}{u}   {b} {num(m['champion'])}{u}   diff {signed(m['diff'])}{u}",
             f"  95% CI [{signed(m['ci_low'])}, {signed(m['ci_high'])}]   SE total {num(m['se'])}{df}",
             f"  SE item {num(m.get('se_item', m['se']))}   {seed}",
             f"  p worse {m['p_regression']:.3g} (Holm {m['p_regression_holm']:.3g})   p better "
             f"{m['p_improvement']:.3g} (Holm {m['p_improvement_holm']:.3g})",
             f"  MDE (80% power) better {num(m.get('mde', 0.0))}, worse {num(m.get('mde_worse', 0.0))}   "
             f"items {m['n_items']}, clusters {m['n_clusters']}"]
    return [part for line in lines for part in wrap(line, width, "    ")]


def comparison_text(result: Mapping[str, Any], width: int = LOG_WIDTH) -> str:
    """``codemill compare`` at ``width`` columns: the two models, the verdict, then each metric."""
    lines = [f"a (candidate): {result['model_a']}", f"b (reference): {result['model_b']}",
             "paired on the same eval items", "",
             *wrap(f"verdict: {result['verdict']} (alpha {result['alpha']}, Holm-corrected)", width),
             *wrap(f"reason: {result['reason']}", width), ""]
    if result.get("calibration"):
        lines += wrap(f"noise: calibrated ({result['calibration']})", width)
    else:
        lines += wrap("noise: uncalibrated (item-level SE only; no seed noise for b's recipe)", width)
    lines += suite_sections(result, width)
    for m in result["metrics"]:
        lines += ["", *metric_lines(m, "a", "b", width)]
    return "\n".join(lines)


def suite_sections(result: Mapping[str, Any], width: int = LOG_WIDTH) -> list[str]:
    """The sections of ``codemill compare`` that suites print of their side-by-side summaries
    (``Suite.compare_lines``; e.g. latency's two checkpoints on one machine), each after a blank line."""
    from codemill.evals.suites import REGISTRY

    lines: list[str] = []
    for suite in REGISTRY.values():
        if suite.compare_lines is not None and result.get(suite.name):
            lines += ["", *suite.compare_lines(result[suite.name], width)]
    return lines


def own_lines(scores: Mapping[str, Any], stages: Mapping[str, Any], width: int = LOG_WIDTH) -> list[str]:
    """The run summary's lines of the suites that show themselves (``Suite.summary_line``; e.g. latency's
    percentiles), from the run's scores and each one's step summary."""
    from codemill.evals.suites import REGISTRY

    lines: list[str] = []
    for suite in REGISTRY.values():
        if suite.summary_line is not None:
            line = suite.summary_line(scores, (stages.get(f"eval:{suite.name}") or {}).get("summary") or {})
            lines += wrap(line, width) if line else []
    return lines


def skipped_suites(stages: Mapping[str, Any]) -> dict[str, str]:
    """Suite -> why it did not apply to the model, from a flow result's ``stages`` (``eval:<suite>`` steps whose
    summary says ``skipped``); the steps are StageResults or their JSON dumps."""
    out = {}
    for key, st in stages.items():
        summary = st.get("summary") if isinstance(st, Mapping) else getattr(st, "summary", None)
        if key.startswith("eval:") and summary and summary.get("skipped"):
            out[key.removeprefix("eval:")] = str(summary["skipped"])
    return out


STATUS = {"cached": "cached", "present": "in store"}  # a stage's status as the summary says it (else "ran")
VERBOSE_HINT = "(--verbose: every score, and each gate metric's noise in full)"


def summary_lines(out: Mapping[str, Any], wall_s: float, width: int = LOG_WIDTH, verbose: bool = False) -> list[str]:
    """The run summary at ``width`` columns: one line per stage (status, cost, artifact), one line per suite
    (its headline metric and 95% CI), the gate's verdict with one line per metric; ``verbose`` adds every
    score and each gate metric's noise in full (the MLflow run's report has both)."""
    root = store_root(out["stages"])
    lines = [f"codemill finished in {wall_s:.1f}s", *(wrap(f"store: {root}", width) if root else []), "",
             *stage_table(out["stages"], root, width)]
    suites = suite_lines(out, width)
    lines += ["", *suites] if suites else []
    if verbose and score_keys(out["scores"]):
        lines += ["", *score_table(out["scores"])]
    lines += gate_lines(out, width, verbose)
    if not verbose and (score_keys(out["scores"]) or (out.get("gate") or {}).get("metrics")):
        lines += wrap(VERBOSE_HINT, width)
    return lines


def store_root(stages: Mapping[str, Any]) -> str:
    """The store root the stages' artifacts live under (an artifact's URI ends in
    ``<stage>/<name>-<digest, 12 hex>``); "" when no URI says."""
    for st in stages.values():
        ref = st["ref"]
        tail = f"/{ref.get('stage')}/{artifact_folder(ref)}"
        if str(ref.get("uri", "")).endswith(tail):
            return str(ref["uri"])[:-len(tail)]
    return ""


def artifact_folder(ref: Mapping[str, Any]) -> str:
    """The artifact's folder name in its stage's folder of the store."""
    return f"{ref['name']}-{ref['digest'][:12]}"


def stage_table(stages: Mapping[str, Any], root: str, width: int = LOG_WIDTH) -> list[str]:
    """One line per stage: status, cost (stages that did not run cost nothing) and the artifact as a path under
    the store root, or, where those paths do not fit ``width``, the 12-hex digest its folder name ends in."""
    from codemill.cost import KEYS

    cols = [Column("stage"), Column("status"), Column("wall s", ">"), Column("CPU s", ">"), Column("GPU s", ">")]
    rows = []
    for name, st in stages.items():
        status = STATUS.get(st["status"], "ran")
        cost = (st.get("cost") or {}) if status == "ran" else {}
        rows.append(([name, status, *(f"{cost[k]:.1f}" if k in cost else "-" for k in KEYS)], st["ref"]))

    def path(ref: Mapping[str, Any]) -> str:
        uri = str(ref.get("uri") or "")
        return relative_to(uri, root) if root and uri else artifact_folder(ref)

    return first_fitting(
        [lambda: table([*cols, Column("artifact (in the store)")], [[*r, path(ref)] for r, ref in rows]),
         lambda: table([*cols, Column("digest")], [[*r, ref["digest"][:12]] for r, ref in rows])], width)


def suite_lines(out: Mapping[str, Any], width: int = LOG_WIDTH) -> list[str]:
    """One line per suite the run evaluated: its headline metric with the 95% CI; the lines of the suites that
    show themselves (latency's percentiles); for a suite that did not apply to the model, why."""
    from codemill.evals.suites import REGISTRY

    stages, scores = out["stages"], out["scores"]
    skipped = skipped_suites(stages)
    rows = []
    for key in stages:
        suite = key.removeprefix("eval:")
        metric = REGISTRY[suite].headline_metric if key.startswith("eval:") and suite in REGISTRY else ""
        if metric in scores and suite not in skipped:
            low, high = scores.get(f"{metric}_ci_low"), scores.get(f"{metric}_ci_high")
            rows.append([suite, metric, num(scores[metric]), ci(low, high) if low is not None and high is not None
                         else ""])
    cols = [Column("suite"), Column("headline metric"), Column("value", ">"), Column("95% CI")]
    lines = first_fitting([lambda: table(cols, rows), lambda: table(cols[1:], [r[1:] for r in rows])],
                          width) if rows else []
    lines += own_lines(scores, stages, width)
    for suite, reason in sorted(skipped.items()):
        lines += wrap(f"{suite}: skipped ({reason})", width)
    return lines


def score_keys(scores: Mapping[str, Any]) -> list[str]:
    """The scores a table lists: each metric once (its CI bounds go with it), but for those of the suites with a
    line of their own (``Suite.summary_line``)."""
    from codemill.evals.suites import REGISTRY

    own = tuple(k for s in REGISTRY.values() if s.summary_line is not None for k in s.summary_keys)
    return sorted(k for k in scores if "_ci_" not in k and not k.startswith(own))


def score_table(scores: Mapping[str, Any]) -> list[str]:
    """Every score of the run with its 95% CI (where the suite computed one)."""
    rows = []
    for key in score_keys(scores):
        low, high = scores.get(f"{key}_ci_low"), scores.get(f"{key}_ci_high")
        rows.append([key, num(scores[key]), ci(low, high) if low is not None and high is not None else ""])
    return table([Column("metric"), Column("value", ">"), Column("95% CI")], rows)


def gate_lines(out: Mapping[str, Any], width: int = LOG_WIDTH, verbose: bool = False) -> list[str]:
    """The gate's verdict and reason, then one line per metric (``verbose``: each metric's noise in full)."""
    g = out.get("gate")
    if not g:
        return []
    lines = ["", *wrap(f"gate: {g['verdict']} ({g['reason']}); {g['registered_model']}@{g['alias']} = "
                       f"version {g['champion_version']}", width)]
    if g.get("calibration"):
        lines += wrap(f"noise: {g['calibration']}", width)
    metrics = g.get("metrics") or []
    if verbose:
        for m in metrics:
            lines += metric_lines(m, width=width)
    elif metrics:
        lines += gate_table(metrics, width)
    if metrics and not g.get("calibrated"):
        lines += wrap(calibrate_advice(g.get("calibrate_advice", "codemill calibrate --seeds 10"), out["stages"]),
                      width)
    return lines


def gate_table(metrics: Sequence[Mapping[str, Any]], width: int = LOG_WIDTH) -> list[str]:
    """One line per gate metric: the difference (+ = the candidate is better), its 95% CI and the
    Holm-corrected p-values of both tests; the CI is left out where it does not fit ``width``."""
    rows = [[m["metric"], signed(m["diff"]) + unit_of(m["metric"]), f"[{signed(m['ci_low'])}, {signed(m['ci_high'])}]",
             f"{m['p_regression_holm']:.3g}", f"{m['p_improvement_holm']:.3g}"] for m in metrics]
    cols = [Column("gate metric"), Column("diff", ">"), Column("95% CI"), Column("p worse", ">"),
            Column("p better", ">")]
    return first_fitting([lambda: table(cols, rows),
                          lambda: table([c for i, c in enumerate(cols) if i != 2],
                                        [[c for i, c in enumerate(r) if i != 2] for r in rows])], width)


def plan_lines(rows: Sequence[Mapping[str, Any]], root: str, until: str, width: int = LOG_WIDTH) -> list[str]:
    """``codemill plan``'s steps at ``width`` columns: each step's action and artifact (a path under the store
    root; where the paths do not fit, the 12-hex digest its folder name ends in)."""
    def path(row: Mapping[str, Any]) -> str:
        return relative_to(row["uri"], root)

    step, action = Column("step"), Column("action")
    return [f"codemill plan until {until}", *wrap(f"store: {root}", width), "", *first_fitting(
        [lambda: table([step, Column("digest"), action, Column("artifact (in the store)")],
                       [[r["step"], r["digest"][:12], r["action"], path(r)] for r in rows]),
         lambda: table([step, action, Column("artifact (in the store)")], [[r["step"], r["action"], path(r)]
                                                                          for r in rows]),
         lambda: table([step, action, Column("digest")], [[r["step"], r["action"], r["digest"][:12]] for r in rows])],
        width)]


def footer_lines(out: Mapping[str, Any], width: int = LOG_WIDTH) -> list[str]:
    """Where the run is recorded and how to look at it."""
    uri = out["tracking_uri"]
    ui = f"mlflow ui --backend-store-uri {uri}" if uri.startswith("sqlite") else f"MLflow: {uri}"
    return [*wrap(f"MLflow run:  {out['parent_run_id']} (experiment {out['experiment_id']})", width),
            *(wrap(f"Model:       models:/{out['model_id']}", width) if out.get("model_id") else []),
            *wrap(f"Prefect flow run: {out['flow_run_id']}", width),
            "Open the UIs:", *wrap(f"  {ui}", width, "    "),
            *wrap("  prefect server start   # then http://127.0.0.1:4200 (runs appear there when PREFECT_API_URL "
                  "points at it)", width, "                         # ")]


# The per-iteration columns of ``codemill rl``: (heading, row key, width, format). "signal" is the share of groups
# whose rewards differ: GRPO learns only from those (the others have zero advantage). "turns" is the mean number
# of policy turns per episode, "obs" the share of tokens after the prompt that the environment wrote (no loss).
# "rollout s" is the rollouts' wall time: generation (several batches at once) and judging overlap, so their own
# sums (in the MLflow run and the flow's result) can exceed it.
RL_COLUMNS = (("iter", "iteration", 4, "d"), ("reward", "reward_mean", 7, ".3f"),
              ("pass", "pass_rate", 6, ".3f"), ("signal", "signal_groups", 7, ".2f"), ("kl", "kl", 10, "num"),
              ("tokens", "response_tokens_mean", 7, ".1f"), ("turns", "turns_mean", 6, ".2f"),
              ("obs", "observed_token_frac", 5, ".2f"), ("rollout s", "rollout_wall_s", 10, ".1f"),
              ("update s", "update_s", 9, ".1f"))
LEARNABLE_SHARE_TARGET = 0.2


def rl_summary_lines(out: Mapping[str, Any], wall_s: float, width: int = LOG_WIDTH) -> list[str]:
    """``codemill rl``'s summary at ``width`` columns: one row per iteration, the held-out pass rate before and
    after with the CI of the gain, and one warning line when no group ever had a learnable signal."""
    rows = out["iterations"]

    def cell(r: Mapping[str, Any], key: str, w: int, f: str) -> str:
        value = r.get(key)
        return f"{'-':>{w}}" if value is None else f"{num(value) if f == 'num' else format(value, f):>{w}}"

    lines = [f"codemill rl: {len(rows)} iterations in {wall_s:.1f}s", "",
             "".join(f"{h:>{w}}" for h, _, w, _ in RL_COLUMNS)]
    lines += ["".join(cell(r, k, w, f) for _, k, w, f in RL_COLUMNS) for r in rows]
    lines += wrap(f"signal: share of groups whose rewards differ, what GRPO learns from (aim for >= "
                  f"{LEARNABLE_SHARE_TARGET:.0%})", width)
    if rows and all(r.get("signal_groups") == 0 for r in rows):
        lines += wrap("no learnable signal: every group had equal rewards (try rl.warm_start or an easier set)",
                      width)
    h = out["heldout"]
    lines += ["", *wrap(
        f"held-out pass rate: {h['before']['rate']:.3f} -> {h['after']['rate']:.3f} (gain {h['gain']:+.3f}, "
        f"95% CI [{h['gain_ci_low']:+.3f}, {h['gain_ci_high']:+.3f}], p={h['p_value']:.3g}, "
        f"{h['problems']} problems)", width)]
    if out.get("gate"):
        lines.append(f"gate: {out['gate']['verdict']}")
    lines += wrap(f"final policy: LoggedModel {out['model_id']}; MLflow parent run {out['parent_run_id']}", width)
    return lines


PROBLEM_COUNTS = ("read", "malformed", "reference_failed", "unverified", "duplicate", "contaminated", "kept", "train",
                  "val")


def problem_count_lines(result: Mapping[str, Any], wall_s: float, width: int = LOG_WIDTH) -> list[str]:
    """``codemill problems`` at ``width`` columns: each count per source and in total (the sources in as many
    tables one under the other as the width needs), the mining steps, the artifact."""
    summary = result["summary"]
    status = {"cached": "skipped (cached)", "present": "skipped (in store)"}.get(result["status"], "ran")
    sources = summary["by_source"]
    columns = [*(Column(name, ">") for name in sources), Column("total", ">")]
    rows = [(count, [*(str(c[count]) for c in sources.values()), str(summary["totals"][count])])
            for count in PROBLEM_COUNTS]
    lines = [f"codemill problems: {status} in {wall_s:.1f}s", "",
             *table_in_parts(Column("count"), columns, rows, width)]
    for name, counts in sources.items():
        if counts.get("mining"):
            lines += wrap(f"{name} mining steps: " + ", ".join(f"{k} {v}" for k, v in counts["mining"].items()),
                          width)
    return [*lines, *wrap(f"artifact: {result['ref']['uri']} (digest {result['ref']['digest'][:12]})", width),
            f"MLflow run: {result['run_id']}"]


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


CALIBRATION_COLUMNS = (("seed SD", "seed_sd"), ("item SE", "item_se"), ("SE cmp", "se_total"),
                       ("MDE +", "mde_better"), ("MDE -", "mde_worse"))


def calibration_lines(out: Mapping[str, Any], wall_s: float, width: int = LOG_WIDTH) -> list[str]:
    """``codemill calibrate`` at ``width`` columns: per metric the seed SD, item SE, SE of a comparison and
    the MDE at 80% power, then the cost of each stage."""
    root = store_root(out["stages"])
    rows = [(r["metric"], [num(r[key]) for _, key in CALIBRATION_COLUMNS]) for r in out["metrics"]]
    lines = [*wrap(f"codemill calibrate finished in {wall_s:.1f}s: recipe {out['recipe_key'][:12]}, "
                   f"seeds {', '.join(map(str, out['seeds']))}", width),
             *wrap(f"artifact: {out['calibration']}", width), "",
             *table_in_parts(Column("metric"), [Column(h, ">") for h, _ in CALIBRATION_COLUMNS], rows, width),
             *wrap("SE cmp = sqrt(item SE^2 + 2 seed SD^2): a comparison of two trainings; MDE +/-: the smallest "
                   f"improvement / regression the gate detects with 80% power (alpha {out['alpha']}).", width, ""),
             "", "cost:", *(wrap(f"store: {root}", width) if root else []),
             *stage_table(out["stages"], root, width),
             *wrap(f"registered model {out['registered_model']}; MLflow run {out['parent_run_id']}", width)]
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
