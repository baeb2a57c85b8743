"""Measure the seed noise a preset ships with: train ``--seeds`` seeds of the preset (data stages shared),
evaluate each on the preset's suites, and write ``codemill/configs/<preset>.noise.json`` (``--write``): per
metric every seed's value, the seed SD and the RMS paired item SE, with the recipe key and suite digests the
gate matches a champion against, and the date, machine and commit of the measurement.

``--also-steps 50`` measures the same seeds at other step counts (printed and stored for reference; the gate
uses the preset's own step count only). Everything is cached in ``--work`` (store + MLflow), so a rerun only
reads.

    python -m benchmarks.preset_noise --preset tiny --seeds 10 [--also-steps 50] [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import time
from importlib import resources
from pathlib import Path
from typing import Any

from codemill.config import PipelineConfig, load_preset

FIRST_SEED = 1234  # TrainConfig's default seed: the preset's own training is one of the measured seeds


def _env(work: Path) -> None:
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect"))


def bench_config(preset: str, work: Path) -> PipelineConfig:
    """The preset as shipped, with its store, work folder and MLflow under ``work``, and no gate."""
    cfg = load_preset(preset)
    cfg.name = f"bench-noise-{preset}"
    cfg.store_root, cfg.work_dir = str(work / "store"), str(work / "work")
    cfg.mlflow_tracking_uri = f"sqlite:///{work / 'mlflow.db'}"
    cfg.gate.enabled = False
    return cfg


def variant(cfg: PipelineConfig, seed: int, steps: int | None = None) -> PipelineConfig:
    c = cfg.model_copy(deep=True)
    c.train.seed = seed
    if steps is not None:
        c.train.max_steps = steps
    return c


def run_scores(cfg: PipelineConfig) -> dict[str, Any]:
    """The per-item scores of a pipeline run of ``cfg`` (trained and evaluated, or found in the store)."""
    import polars as pl

    from codemill.evals import suites
    from codemill.flows.pipeline import pipeline
    from codemill.store import ArtifactRef, ArtifactStore

    out = pipeline(config=cfg)
    store = ArtifactStore(cfg.store_root)
    scores: dict[str, Any] = {}
    for key, st in out["stages"].items():
        if key.startswith("eval:"):
            ref = ArtifactRef.model_validate(st["ref"])
            scores |= suites.item_scores(ref.name, pl.read_parquet(store.local_path(ref) / suites.rows_file(ref.name)))
    return scores


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def measure(cfg: PipelineConfig, seeds: list[int], steps: int | None = None) -> dict[str, Any]:
    from codemill.gate.scores import calibrate

    per_seed = []
    for seed in seeds:
        t = time.perf_counter()
        per_seed.append(run_scores(variant(cfg, seed, steps)))
        print(f"  seed {seed} at {steps or cfg.train.max_steps} steps: {time.perf_counter() - t:.0f}s", flush=True)
    return calibrate(per_seed)


def print_noise(title: str, noise: dict[str, Any]) -> None:
    print(title)
    print(f"  {'metric':<28}{'seeds':>6}{'mean':>9}{'seed SD':>9}{'item SE':>9}")
    for name, n in noise.items():
        print(f"  {name:<28}{n.n_seeds:>6}{sum(n.values) / n.n_seeds:>9.4f}{n.seed_sd:>9.4f}{n.item_se:>9.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--also-steps", type=int, nargs="*", default=[])
    p.add_argument("--work", default=".codemill/bench-noise")
    p.add_argument("--write", action="store_true", help="write codemill/configs/<preset>.noise.json")
    p.add_argument("--unmeasured", metavar="REASON", default=None,
                   help="write the file without training (keys only, no noise), saying why it was not measured")
    args = p.parse_args()
    work = Path(args.work).absolute()
    work.mkdir(parents=True, exist_ok=True)
    _env(work)
    from codemill.flows.plan import config_recipe
    from codemill.gate import preset_noise as pn
    from codemill.gate.calibration import recipe_key

    cfg = bench_config(args.preset, work)
    seeds = list(range(FIRST_SEED, FIRST_SEED + args.seeds))
    t0 = time.perf_counter()
    steps = cfg.train.max_steps
    noise = measure(cfg, seeds) if args.unmeasured is None else {}
    if noise:
        print_noise(f"{args.preset} at {steps} steps ({time.perf_counter() - t0:.0f}s)", noise)
    reference = {}
    for other in args.also_steps if noise else []:
        extra = measure(cfg, seeds, other)
        print_noise(f"{args.preset} at {other} steps", extra)
        reference[str(other)] = {k: {"seed_sd": v.seed_sd, "n_seeds": v.n_seeds, "mean": sum(v.values) / v.n_seeds,
                                     "item_se": v.item_se} for k, v in extra.items()}
    shipped = load_preset(args.preset)
    recipe = config_recipe(shipped)
    result = pn.PresetNoise(
        preset=args.preset, recipe_key=recipe_key(recipe),
        suite_digests=pn.suite_digests(shipped.evaluate.digest_config()), train=recipe["train"]["config"],
        metrics=noise, measured={"date": dt.date.today().isoformat(), "commit": commit(), "machine": machine(),
                                 "command": f"python -m benchmarks.preset_noise --preset {args.preset} --seeds "
                                            f"{args.seeds}", "seeds": seeds, "steps": steps,
                                 "other_steps": reference} if noise else None, reason=args.unmeasured or "")
    if args.write:
        path = Path(str(resources.files("codemill.configs") / pn.noise_file(args.preset)))
        path.write_text(json.dumps(result.as_dict(), indent=2) + "\n")
        print(f"wrote {path}")
    print(f"total {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
