"""False promotions and false regressions of the gate on the default preset, before and after it knew the
training noise.

On a preset (default ``tiny``, at its own step count) it trains and evaluates (or finds in ``--work``):

- ``--calibration-seeds`` seeds 1234, 1235, ... (the seeds ``benchmarks.preset_noise`` measures; 1234, the
  preset's own seed, is the champion);
- ``--candidates`` seed-only candidates, seeds 2000, 2001, ... (never part of a measurement), which a correct
  gate must hold;
- an improved candidate (``--better`` x the steps; must be promoted) and a degraded one (``--worse`` x the
  steps; must be a regression).

Each candidate is judged by four gates on the same eval rows:

- **before**: the gate as it was released before presets shipped their noise: item SE, hold margins at the
  metrics' floors (``Metric.hold_margin``: 0.12 bpb, 0.05 for the rates);
- **default**: what ``codemill run`` does now with no calibration in the store: the noise shipped in
  ``codemill/configs/<preset>.noise.json`` (the preset's recipe matches);
- **uncalibrated**: a recipe no preset matches: item SE, hold margins derived from the nearest preset;
- **calibrated**: ``codemill calibrate --seeds 5`` (the first 5 calibration seeds).

It counts false promotions and false regressions of the seed-only candidates against the champion, and over
every (calibration seed, candidate) pair (pairs share models, so their CI is optimistic), with exact binomial
95% CIs, and reports the seed SD per metric at the preset's steps and at ``--also-steps``. It also judges the
candidates in groups of ``--seeds-in-run``, as ``train.seeds`` would: the mean of each group, with its spread.
The champion's own training is one of the shipped measurement's seeds, as it is for a user of the preset.

    python -m benchmarks.calibration [--preset tiny] [--candidates 10] [--also-steps 50] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.preset_noise import FIRST_SEED, _env, bench_config, print_noise, run_scores, variant

CANDIDATE_SEED = 2000
GATES = ("before", "default", "uncalibrated", "calibrated")


def binomial_ci(k: int, n: int) -> tuple[float, float]:
    from scipy import stats

    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return float(ci.low), float(ci.high)


def judges(cfg: Any, per_seed: dict[int, dict[str, Any]], calibrated_seeds: int) -> dict[str, Any]:
    """The noise source (``gate.evidence.NoiseSource``) of each of the four gates."""
    from codemill.flows.plan import config_recipe
    from codemill.gate import preset_noise as pn
    from codemill.gate.calibration import recipe_key
    from codemill.gate.evidence import NoiseSource
    from codemill.gate.scores import calibrate

    names = [m.name for m in cfg.gate.metrics]
    recipe = config_recipe(cfg)
    presets = pn.load_preset_noise()
    shipped = pn.matching(presets, recipe_key(recipe), cfg.evaluate.digest_config())
    if shipped is None:
        raise SystemExit(f"no shipped noise matches preset {cfg.name}: run python -m benchmarks.preset_noise --write")
    near = pn.nearest(presets, recipe["train"]["config"])  # as a changed copy of the preset would see it
    seeds = sorted(per_seed)[:calibrated_seeds]
    return {"before": NoiseSource(),
            "default": NoiseSource("preset", shipped[1], shipped[0].label),
            "uncalibrated": NoiseSource(hold_margins=pn.hold_margins(near, names)),
            "calibrated": NoiseSource("calibration", calibrate([per_seed[s] for s in seeds]),
                                      f"codemill calibrate --seeds {calibrated_seeds} (seeds {seeds})")}


def verdicts(per_seed: list[dict], champ: dict, cfg: Any, kinds: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each gate's verdict on a candidate (``per_seed``: its seeds' scores) against ``champ``. The gate as it
    was before shipped noise judged the mean of several seeds as one model, without their spread."""
    from codemill.gate.evidence import GateMetric, collect
    from codemill.gate.policy import decide
    from codemill.gate.scores import mean_scores

    metrics = [GateMetric(m.name, m.margin, m.uncalibrated_margin) for m in cfg.gate.metrics]
    out = {}
    for kind, noise in kinds.items():
        seeds = [mean_scores(per_seed)] if kind == "before" and len(per_seed) > 1 else per_seed
        v = decide(collect(seeds, champ, metrics, noise), cfg.gate.alpha)
        out[kind] = {"verdict": v.verdict, "metrics": {e.metric: {
            "diff": e.diff, "se": e.se, "se_item": e.se_item, "seed_sd": e.seed_sd, "hold_margin": e.hold_margin,
            "p_worse_holm": e.p_regression_holm, "p_better_holm": e.p_improvement_holm} for e in v.metrics}}
    return out


def seeds_in_run(cfg: Any, candidates: dict[int, dict], champion: dict, kinds: dict[str, Any],
                 n: int) -> list[dict[str, Any]]:
    """``train.seeds: n``: the seed-only candidates in groups of n, each group's mean gated with its spread
    (before: the mean on the item SE alone)."""
    seeds = sorted(candidates)
    return [{"candidates": seeds[i:i + n], **verdicts([candidates[s] for s in seeds[i:i + n]], champion, cfg, kinds)}
            for i in range(0, len(seeds) - n + 1, n)]


def rates(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for kind in GATES:
        n = len(results)
        promoted = sum(r[kind]["verdict"] == "promote" for r in results)
        flagged = sum(r[kind]["verdict"] == "regression" for r in results)
        out[kind] = {"n": n, "false_promotions": promoted, "false_promotion_ci": binomial_ci(promoted, n),
                     "false_regressions": flagged, "false_regression_ci": binomial_ci(flagged, n)}
    return out


def print_rates(title: str, table: dict[str, dict[str, Any]]) -> None:
    print(title)
    for kind, r in table.items():
        lo, hi = r["false_promotion_ci"]
        rlo, rhi = r["false_regression_ci"]
        print(f"  {kind:<13} false promotions {r['false_promotions']:>3}/{r['n']:<4} (95% CI {lo:.3f}-{hi:.3f})"
              f"   false regressions {r['false_regressions']:>3}/{r['n']:<4} (95% CI {rlo:.3f}-{rhi:.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--calibration-seeds", type=int, default=10)
    p.add_argument("--candidates", type=int, default=10)
    p.add_argument("--calibrated-seeds", type=int, default=5, help="seeds of the codemill calibrate gate")
    p.add_argument("--better", type=float, default=2.0, help="training steps of the improved candidate, x")
    p.add_argument("--worse", type=float, default=1 / 3, help="training steps of the degraded candidate, x")
    p.add_argument("--also-steps", type=int, nargs="*", default=[50], help="also report the seed SD at these steps")
    p.add_argument("--seeds-in-run", type=int, default=3, help="train.seeds of the mean-of-seeds candidates")
    p.add_argument("--work", default=".codemill/bench-noise")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    work = Path(args.work).absolute()
    work.mkdir(parents=True, exist_ok=True)
    _env(work)
    from codemill.gate.scores import calibrate

    cfg = bench_config(args.preset, work)
    steps = cfg.train.max_steps
    t0 = time.perf_counter()
    cal_seeds = list(range(FIRST_SEED, FIRST_SEED + args.calibration_seeds))
    cand_seeds = list(range(CANDIDATE_SEED, CANDIDATE_SEED + args.candidates))
    per_seed = {s: run_scores(variant(cfg, s)) for s in cal_seeds}
    candidates = {s: run_scores(variant(cfg, s)) for s in cand_seeds}
    better = run_scores(variant(cfg, CANDIDATE_SEED, round(steps * args.better)))
    worse = run_scores(variant(cfg, CANDIDATE_SEED, max(1, round(steps * args.worse))))
    print(f"trainings and evaluations ready ({time.perf_counter() - t0:.0f}s)")
    noise = {str(steps): calibrate(list(per_seed.values()))}
    for other in args.also_steps:
        noise[str(other)] = calibrate([run_scores(variant(cfg, s, other)) for s in cal_seeds])
    for st, n in noise.items():
        print_noise(f"seed noise at {st} steps ({len(cal_seeds)} seeds)", n)

    kinds = judges(cfg, per_seed, args.calibrated_seeds)
    champion = per_seed[FIRST_SEED]
    vs_champion = [{"candidate": s, **verdicts([candidates[s]], champion, cfg, kinds)} for s in cand_seeds]
    pairs = [{"champion": c, "candidate": s, **verdicts([candidates[s]], per_seed[c], cfg, kinds)}
             for c in cal_seeds for s in cand_seeds]
    real = {f"{args.better:g}x steps (must promote)": verdicts([better], champion, cfg, kinds),
            f"{args.worse:.2g}x steps (must be a regression)": verdicts([worse], champion, cfg, kinds)}
    print(f"\n{'candidate vs seed ' + str(FIRST_SEED):<34}" + "".join(f"{k:>14}" for k in GATES) + "   diff bpb")
    for r in vs_champion:
        print(f"{'seed ' + str(r['candidate']):<34}" + "".join(f"{r[k]['verdict']:>14}" for k in GATES)
              + f"   {r['before']['metrics']['val_bpb']['diff']:+.4f}")
    for label, r in real.items():
        print(f"{label:<34}" + "".join(f"{r[k]['verdict']:>14}" for k in GATES)
              + f"   {r['before']['metrics']['val_bpb']['diff']:+.4f}")
    seeded = seeds_in_run(cfg, candidates, champion, kinds, args.seeds_in_run)
    for r in seeded:
        print(f"{'mean of seeds ' + str(r['candidates']):<34}" + "".join(f"{r[k]['verdict']:>14}" for k in GATES)
              + f"   {r['default']['metrics']['val_bpb']['diff']:+.4f}")
    print("\nhold margins (uncalibrated): " + ", ".join(f"{m} {v:.3f}" for m, v in
                                                      kinds["uncalibrated"].hold_margins.items()))
    table, pair_table = rates(vs_champion), rates(pairs)
    print_rates(f"\n{len(cand_seeds)} seed-only candidates vs the champion (seed {FIRST_SEED})", table)
    print_rates(f"every pair of {len(cal_seeds)} calibration seeds x {len(cand_seeds)} candidates", pair_table)
    print(f"total {time.perf_counter() - t0:.0f}s")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "preset": args.preset, "steps": steps,
            "seed_noise": {st: {k: v.as_dict() for k, v in n.items()} for st, n in noise.items()},
            "hold_margins": kinds["uncalibrated"].hold_margins, "vs_champion": vs_champion,
            "rates_vs_champion": table, "rates_all_pairs": pair_table, "real_changes": real,
            "seeds_in_run": seeded}, indent=2, default=str))


if __name__ == "__main__":
    main()
