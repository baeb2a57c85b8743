"""False alarms and power of the gate, before and after it knew the training noise.

On a preset (default ``tiny``): calibrate ``--seeds`` seeds of the config (``codemill calibrate``), then train
and evaluate candidates against the champion (the config's own seed):

- ``--candidates`` seed-only candidates: the same config with seeds outside the calibration, which a correct
  gate must hold (any other verdict is a false alarm);
- an improved candidate: ``--better`` times the training steps (must be promoted);
- a degraded candidate: ``--worse`` times the steps (must be a regression).

Each candidate is judged three ways on the same eval rows: **before** (the gate as it was: item-level SE only,
no hold margin), **uncalibrated** (today's gate with no calibration: item SE, default hold margins) and
**calibrated** (item SE plus twice the seed variance). It prints the calibration (seed SD, item SE, MDE per
metric), every verdict, and the false-alarm rate and power of each gate; ``--out`` writes them as JSON.
Everything is cached in ``--work`` (store + MLflow), so a rerun only judges.

    python -m benchmarks.calibration [--preset tiny] [--steps N] [--seeds 5] [--candidates 5]
                                     [--suites bpb completion] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from codemill.config import PipelineConfig, load_preset


def _env(work: Path) -> None:
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect"))


def config(args: argparse.Namespace) -> PipelineConfig:
    cfg = load_preset(args.preset)
    work = Path(args.work).absolute()
    cfg.name = f"bench-calibration-{args.preset}"
    cfg.store_root, cfg.work_dir = str(work / "store"), str(work / "work")
    cfg.mlflow_tracking_uri = f"sqlite:///{work / 'mlflow.db'}"
    cfg.evaluate.suites = args.suites
    if args.steps:
        cfg.train.max_steps = args.steps
    return cfg


def variant(cfg: PipelineConfig, seed: int, steps: int) -> PipelineConfig:
    c = cfg.model_copy(deep=True)
    c.train.seed, c.train.max_steps = seed, steps
    c.gate.enabled = False  # judged below, champion fixed
    return c


def scores_of_run(out: dict[str, Any], cfg: PipelineConfig) -> dict[str, Any]:
    import polars as pl

    from codemill.evals import suites
    from codemill.store import ArtifactRef, ArtifactStore

    store = ArtifactStore(cfg.store_root)
    scores: dict[str, Any] = {}
    for key, st in out["stages"].items():
        if key.startswith("eval:"):
            ref = ArtifactRef.model_validate(st["ref"])
            scores |= suites.item_scores(ref.name, pl.read_parquet(store.local_path(ref) / suites.rows_file(ref.name)))
    return scores


def judge(cand: dict, champ: dict, cfg: PipelineConfig, noise: dict | None) -> dict[str, dict[str, Any]]:
    from codemill.evals.gate import GateMetric, gate

    names = [m for m in cfg.gate.metrics if m.name in cand and m.name in champ]
    out = {}
    for label, metrics, n in (
            ("before", [GateMetric(m.name, m.margin, 0.0) for m in names], None),
            ("uncalibrated", [GateMetric(m.name, m.margin, m.uncalibrated_margin) for m in names], None),
            ("calibrated", [GateMetric(m.name, m.margin) for m in names], noise)):
        v = gate(cand, champ, metrics, cfg.gate.alpha, n)
        out[label] = {"verdict": v.verdict, "metrics": {e.metric: {
            "diff": e.diff, "se": e.se, "se_item": e.se_item, "seed_sd": e.seed_sd, "p_worse_holm": e.p_regression_holm,
            "p_better_holm": e.p_improvement_holm, "mde": e.mde} for e in v.metrics}}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seeds", type=int, default=5, help="calibration seeds (the champion's seed is the first)")
    p.add_argument("--candidates", type=int, default=5, help="seed-only candidates (seeds not calibrated)")
    p.add_argument("--better", type=float, default=3.0, help="training steps of the improved candidate, x")
    p.add_argument("--worse", type=float, default=0.1, help="training steps of the degraded candidate, x")
    p.add_argument("--suites", nargs="+", default=["bpb", "completion"])
    p.add_argument("--steps", type=int, default=None, help="training steps of the config (default: the preset's)")
    p.add_argument("--work", default=".codemill/bench-calibration")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    work = Path(args.work).absolute()
    work.mkdir(parents=True, exist_ok=True)
    _env(work)
    from codemill.evals.calibration import find_calibration, noise_of
    from codemill.flows.calibrate import calibrate
    from codemill.flows.pipeline import pipeline
    from codemill.store import ArtifactStore

    cfg = config(args)
    base_seed, steps = cfg.train.seed, cfg.train.max_steps
    t0 = time.perf_counter()
    cal = calibrate(config=cfg, seeds=args.seeds)
    print(f"calibration of {cal['config_key'][:12]} on seeds {cal['seeds']} ({time.perf_counter() - t0:.0f}s)")
    print(f"{'metric':<28}{'seed SD':>9}{'item SE':>9}{'SE cmp':>9}{'MDE +':>9}{'MDE -':>9}")
    for r in cal["metrics"]:
        print(f"{r['metric']:<28}{r['seed_sd']:>9.4f}{r['item_se']:>9.4f}{r['se_total']:>9.4f}"
              f"{r['mde_better']:>9.4f}{r['mde_worse']:>9.4f}")
    found = find_calibration(ArtifactStore(cfg.store_root), cal["config_key"])
    assert found is not None
    noise = noise_of(found[1])
    champion = scores_of_run(pipeline(config=variant(cfg, base_seed, steps)), cfg)
    new_seeds = [s for s in range(base_seed + 1000, base_seed + 2000) if s not in cal["seeds"]][: args.candidates]
    candidates = [(f"seed {s}", "hold", variant(cfg, s, steps)) for s in new_seeds]
    candidates += [(f"seed {s} (calibration)", "hold", variant(cfg, s, steps)) for s in cal["seeds"][1:]]
    better, worse = round(steps * args.better), max(1, round(steps * args.worse))
    candidates += [(f"{args.better:g}x steps", "promote", variant(cfg, base_seed + 1, better)),
                   (f"{args.worse:g}x steps", "regression", variant(cfg, base_seed + 1, worse))]
    results = []
    for label, expected, c in candidates:
        t1 = time.perf_counter()
        scores = scores_of_run(pipeline(config=c), cfg)
        verdicts = judge(scores, champion, cfg, noise)
        results.append({"candidate": label, "expected": expected, **verdicts})
        diffs = ", ".join(f"{k} {v['diff']:+.4f}" for k, v in verdicts["calibrated"]["metrics"].items())
        print(f"{label:<26} before {verdicts['before']['verdict']:<10} uncalibrated "
              f"{verdicts['uncalibrated']['verdict']:<10} calibrated {verdicts['calibrated']['verdict']:<10} "
              f"({diffs}; {time.perf_counter() - t1:.0f}s)")
    summary = {}
    for gate_kind in ("before", "uncalibrated", "calibrated"):
        fresh = [r for r in results if r["expected"] == "hold" and "calibration" not in r["candidate"]]
        summary[gate_kind] = {
            "false_alarms": sum(r[gate_kind]["verdict"] != "hold" for r in fresh), "seed_only": len(fresh),
            "improved_promoted": all(r[gate_kind]["verdict"] == "promote" for r in results
                                     if r["expected"] == "promote"),
            "degraded_flagged": all(r[gate_kind]["verdict"] == "regression" for r in results
                                    if r["expected"] == "regression")}
        s = summary[gate_kind]
        print(f"{gate_kind:<13} false alarms {s['false_alarms']}/{s['seed_only']} seed-only candidates; improved "
              f"promoted: {s['improved_promoted']}; degraded flagged: {s['degraded_flagged']}")
    print(f"total {time.perf_counter() - t0:.0f}s")
    if args.out:
        Path(args.out).write_text(json.dumps({"calibration": cal["metrics"], "seeds": cal["seeds"],
                                              "candidates": results, "summary": summary}, indent=2, default=str))


if __name__ == "__main__":
    main()
