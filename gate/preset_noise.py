"""The seed noise shipped with each preset, and the hold margin the gate uses when a config was never calibrated.

Each preset ``codemill/configs/<name>.yaml`` has a ``<name>.noise.json`` beside it, written by
``python -m benchmarks.preset_noise --preset <name>``: the recipe key of the preset's training (see
``gate.calibration``), a digest of each suite's eval config, the train config it was measured on and, per
metric, every seed's value (``SeedNoise``), plus when, where and on which commit it was measured. A preset that
could not be measured on the machines at hand has ``"measured": null`` and a reason.

The gate reads it in two ways:

- a champion trained with the preset's recipe (any seed, any starting weights of the same kind) and evaluated
  with the preset's suite configs is **calibrated** by the shipped noise when the store has no calibration of
  its own;
- a champion of any other recipe, never calibrated, gets a **hold margin** per metric derived from the nearest
  measured preset, scaled so that a seed-only retrain of that preset crosses one of the gate's margins in at
  most 2.5% of runs even when the measured seed SD is an underestimate (``safe_hold_margin``), and never below
  the metric's floor (``Metric.hold_margin``). For another recipe that is an assumption: its noise resembles the nearest
  preset's.

No Prefect, no MLflow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from codemill.evals.suites import METRICS, SUITE_OF_METRIC
from codemill.gate.noise import SeedNoise, uncalibrated_margin
from codemill.hashing import digest_of

NOISE_SUFFIX = ".noise.json"
YARDSTICKS = tuple(name for name, m in METRICS.items() if m.noise_yardstick)  # which preset is the noisiest
FALSE_PROMOTION_RATE = 0.025  # a seed-only retrain exceeds one of the hold margins in at most this share of runs
SD_CONFIDENCE = 0.95  # ... even when the true seed SD is at the upper end of this confidence interval


@dataclass(frozen=True)
class PresetNoise:
    """One preset's shipped measurement (``metrics`` empty and ``measured`` None when it was not measured)."""

    preset: str
    recipe_key: str
    suite_digests: dict[str, str]
    train: dict[str, Any]
    metrics: dict[str, SeedNoise] = field(default_factory=dict)
    measured: dict[str, Any] | None = None
    reason: str = ""

    @property
    def label(self) -> str:
        m = self.measured or {}
        return (f"preset {self.preset}: seed noise shipped with codemill ({self.n_seeds} seeds, measured "
                f"{m.get('date', '?')} on commit {str(m.get('commit', '?'))[:10]})")

    @property
    def n_seeds(self) -> int:
        return min((n.n_seeds for n in self.metrics.values()), default=0)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PresetNoise:
        return cls(d["preset"], d["recipe_key"], dict(d["suite_digests"]), dict(d["train"]),
                   {k: SeedNoise.from_dict(v) for k, v in (d.get("metrics") or {}).items()}, d.get("measured"),
                   d.get("reason", ""))

    def as_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, "recipe_key": self.recipe_key, "suite_digests": self.suite_digests,
                "train": self.train, "measured": self.measured, "reason": self.reason,
                "metrics": {k: v.as_dict() for k, v in self.metrics.items()}}


def suite_digest(evaluate_config: Mapping[str, Any], suite: str) -> str:
    """What a suite's items and scores depend on: its own config and the eval seed (completion targets)."""
    return digest_of({"suite": evaluate_config.get(suite), "seed": evaluate_config.get("seed")})


def suite_digests(evaluate_config: Mapping[str, Any], suites: Iterable[str] | None = None) -> dict[str, str]:
    """``suite_digest`` of each of ``suites`` (default: every registered suite)."""
    names = sorted(set(SUITE_OF_METRIC.values()) if suites is None else set(suites))
    return {s: suite_digest(evaluate_config, s) for s in names}


def same_suite_settings(metrics: Mapping[str, Any], measured_with: Mapping[str, str],
                        evaluate_config: Mapping[str, Any]) -> dict[str, Any]:
    """Those of ``metrics`` whose suite is configured now as it was when they were measured (``measured_with``:
    suite -> ``suite_digest``): other suite settings score other items, whose noise this is not."""
    now = suite_digests(evaluate_config, measured_with)
    return {m: v for m, v in metrics.items()
            if (suite := SUITE_OF_METRIC.get(m)) is not None and now.get(suite) == measured_with.get(suite)}


def noise_file(preset: str) -> str:
    return f"{preset}{NOISE_SUFFIX}"


def load_preset_noise() -> list[PresetNoise]:
    """Every measurement shipped in ``codemill.configs`` (measured or not)."""
    root = resources.files("codemill.configs")
    return [PresetNoise.from_dict(json.loads(p.read_text())) for p in sorted(root.iterdir(), key=lambda p: p.name)
            if p.name.endswith(NOISE_SUFFIX)]


def matching(presets: list[PresetNoise], recipe_key: str | None,
             evaluate_config: Mapping[str, Any]) -> tuple[PresetNoise, dict[str, SeedNoise]] | None:
    """A measured preset trained with this recipe, and those of its metrics whose suite is configured as it was
    measured (other suite settings score other items, whose noise this is not)."""
    if recipe_key is None:
        return None
    for p in presets:
        if p.metrics and p.recipe_key == recipe_key:
            same = same_suite_settings(p.metrics, p.suite_digests, evaluate_config)
            if same:
                return p, same
    return None


def _leaves(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, Mapping):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out |= _leaves(v, f"{prefix}{k}.")
        return out
    return {prefix.rstrip("."): d}


def distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    """How many train settings differ (leaves of the two configs, missing counts as different)."""
    la, lb = _leaves(a), _leaves(b)
    return sum(la.get(k) != lb.get(k) for k in set(la) | set(lb))


def nearest(presets: list[PresetNoise], train: Mapping[str, Any] | None) -> PresetNoise | None:
    """The measured preset whose train config is closest to ``train`` (None: unknown config; then the one
    with the largest seed SD on the yardstick metrics, ``Metric.noise_yardstick``: the conservative choice)."""
    measured = [p for p in presets if p.metrics]
    if not measured:
        return None
    if train is None:
        return max(measured, key=lambda p: max((p.metrics[m].seed_sd for m in YARDSTICKS if m in p.metrics),
                                               default=0.0))
    return min(measured, key=lambda p: (distance(p.train, train), p.preset))


def safe_hold_margin(noise: SeedNoise, n_metrics: int = 1, false_rate: float = FALSE_PROMOTION_RATE,
                     confidence: float = SD_CONFIDENCE) -> float:
    """z(1 - false_rate / n_metrics) x sqrt(2) x the upper ``confidence`` bound of the seed SD (chi-square,
    n - 1 df). The difference of two seeds' metrics, N(0, 2 s^2), exceeds it in at most ``false_rate`` /
    ``n_metrics`` of retrains, so a seed-only retrain crosses one of ``n_metrics`` margins in at most
    ``false_rate`` of runs (Bonferroni), unless the seed SD is above its upper bound."""
    from scipy import stats as st

    n = noise.n_seeds
    if n < 2:
        raise ValueError(f"{noise.metric}: a hold margin needs a seed SD from at least 2 seeds")
    sd_upper = noise.seed_sd * math.sqrt((n - 1) / float(st.chi2.ppf(1.0 - confidence, n - 1)))
    return float(st.norm.ppf(1.0 - false_rate / max(1, n_metrics))) * math.sqrt(2.0) * sd_upper


def hold_margins(preset: PresetNoise | None, metrics: list[str], n_metrics: int | None = None) -> dict[str, float]:
    """The uncalibrated hold margin of each metric of a gate of ``n_metrics`` (default: len(metrics)): the safe
    margin from ``preset``'s measurement, never below the metric's floor (``Metric.hold_margin``)."""
    out = {}
    for m in metrics:
        floor = uncalibrated_margin(m)
        measured = preset.metrics.get(m) if preset else None
        out[m] = (max(floor, safe_hold_margin(measured, n_metrics or len(metrics)))
                  if measured and measured.n_seeds >= 2 else floor)
    return out
