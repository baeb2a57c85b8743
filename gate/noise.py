"""Training noise: how much a metric moves between seeds, how that enters the gate, and what the gate can see.

Two trainings of one config that differ only in the seed give different models. On the same eval items their
metrics differ by the *seed noise* (between-seed variance ``s2`` of the metric, measured by training several
seeds: ``codemill calibrate``) on top of the *item noise* (the paired item-level SE of the difference, what the
gate always measured). For a candidate and a champion trained independently,

    Var(diff) = SE_item^2 + 2 * s2        (each of the two trainings contributes one s2)

and since ``s2`` is estimated from n seeds (n - 1 degrees of freedom), tests use Student's t with the
Welch-Satterthwaite degrees of freedom ``(SE_item^2 + 2 s2)^2 / ((2 s2)^2 / (n - 1))`` (the item part has
hundreds of items: its degrees of freedom are taken as infinite). When the candidate is the mean of its own N
seeds (``train.seeds``), its training contributes s2 / N, from its own seeds' spread when measured
(``NoiseModel``): Var(diff) = SE_item^2 + s2_champion + s2_candidate / N.

With no calibration for the champion's config the gate cannot know the seed noise; it then tests on the item
SE alone but treats any difference smaller than a hold margin (``gate.preset_noise``: derived from the seed
noise of the nearest shipped preset, never below the metric's floor, ``Metric.hold_margin`` in its suite) as no
difference: a hold, never a promote or a regression.

Minimum detectable effect (MDE): the smallest true difference the gate reports with probability ``power``
(80%). A metric counts as better when its one-sided p-value is below alpha (Holm; its first step compares the
smallest p with alpha / m, so the MDE uses alpha / m, which is exact for one metric and conservative for more)
and, uncalibrated, when the difference also exceeds the hold margin:

    MDE = max(hold_margin, test_margin + t(1 - alpha/m, df) * SE) + t(power, df) * SE

(``test_margin`` is the metric's tolerated loss for the regression test and 0 for the improvement test).
Pure functions: no Prefect, no MLflow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from codemill.evals import suites

# The floors of the uncalibrated hold margins: with no calibration for the champion's config, differences
# smaller than a hold margin are "no difference". The margin itself comes from the seed noise measured on the
# nearest shipped preset (``gate.preset_noise.hold_margins``), scaled so that a seed-only retrain crosses it in
# under 2.5% of runs; these floors apply where that is smaller, or where no preset measured the metric. Each
# metric declares its floor (``Metric.hold_margin``); a metric no suite reports gets DEFAULT_UNCALIBRATED_MARGIN.
UNCALIBRATED_MARGINS: dict[str, float] = {name: m.hold_margin for name, m in suites.METRICS.items()}
DEFAULT_UNCALIBRATED_MARGIN = suites.DEFAULT_HOLD_MARGIN
DEFAULT_POWER = 0.8


def uncalibrated_margin(metric: str) -> float:
    return suites.hold_margin(metric)


@dataclass(frozen=True)
class SeedNoise:
    """One metric's between-seed spread: its value for each seed's model on the same items, and the RMS
    paired item-level SE between two seeds' models (what the item part of a comparison's SE will be)."""

    metric: str
    values: tuple[float, ...]
    item_se: float = 0.0

    @property
    def n_seeds(self) -> int:
        return len(self.values)

    @property
    def seed_var(self) -> float:
        return float(np.var(self.values, ddof=1)) if self.n_seeds > 1 else 0.0

    @property
    def seed_sd(self) -> float:
        return math.sqrt(self.seed_var)

    def as_dict(self) -> dict:
        return {**asdict(self), "values": list(self.values), "n_seeds": self.n_seeds, "seed_var": self.seed_var,
                "seed_sd": self.seed_sd}

    @classmethod
    def from_dict(cls, d: dict) -> SeedNoise:
        return cls(d["metric"], tuple(float(v) for v in d["values"]), float(d.get("item_se", 0.0)))


def seed_noise(metric: str, values: Sequence[float], item_ses: Sequence[float] = ()) -> SeedNoise:
    """The noise of one metric from >= 2 seeds' values; ``item_ses`` (paired SEs between seed pairs) are
    combined as a root mean square."""
    if len(values) < 2:
        raise ValueError(f"{metric}: the between-seed variance needs at least 2 seeds, got {len(values)}")
    rms = math.sqrt(float(np.mean(np.square(item_ses)))) if len(item_ses) else 0.0
    return SeedNoise(metric, tuple(float(v) for v in values), rms)


def combined_se(item_se: float, seed_var: float) -> float:
    """SE of the difference between two independently trained models: sqrt(SE_item^2 + 2 s2)."""
    return math.sqrt(item_se**2 + 2.0 * seed_var)


def satterthwaite_df(item_se: float, seed_var: float, n_seeds: int) -> float:
    """Welch-Satterthwaite degrees of freedom of SE_item^2 + 2 s2 (item part: infinite; s2: n - 1)."""
    return welch_df(item_se, [(2.0 * seed_var, n_seeds - 1)])


def t_quantile(p: float, df: float) -> float:
    from scipy import stats as st  # here: scipy.stats takes ~1 s to import and a no-change rerun never tests

    return float(st.norm.ppf(p)) if math.isinf(df) else float(st.t.ppf(p, df))


def t_sf(x: float, df: float) -> float:
    """P(T > x); the standard normal when df is infinite."""
    from scipy import stats as st

    return float(st.norm.sf(x)) if math.isinf(df) else float(st.t.sf(x, df))


def welch_df(item_se: float, parts: Sequence[tuple[float, int]]) -> float:
    """Welch-Satterthwaite degrees of freedom of SE_item^2 + sum(v): each ``(v, df)`` is an estimated variance
    term with its degrees of freedom (the item part: infinite)."""
    parts = [(v, d) for v, d in parts if v > 0.0 and d > 0]
    if not parts:
        return math.inf
    total = item_se**2 + sum(v for v, _ in parts)
    return total**2 / sum(v**2 / d for v, d in parts)


@dataclass(frozen=True)
class NoiseModel:
    """What the gate uses for one metric: the SE components, the degrees of freedom, the hold margin.

    ``seed_var`` is the champion's recipe's seed variance (its calibration, else the candidate's own seeds), from
    ``n_seeds`` seeds. The candidate contributes ``cand_var / candidate_seeds`` when its seeds were measured
    apart (``cand_var``, from ``cand_n`` seeds), else ``seed_var / candidate_seeds``."""

    item_se: float
    seed_var: float
    n_seeds: int
    hold_margin: float  # differences with |diff| below this are a hold (uncalibrated only; 0 when calibrated)
    cand_var: float | None = None
    cand_n: int = 0
    candidate_seeds: int = 1  # models averaged into the candidate's scores

    @property
    def calibrated(self) -> bool:
        return self.n_seeds >= 2

    def parts(self) -> list[tuple[float, int]]:
        """(variance added to the comparison, its degrees of freedom) of each estimated seed term."""
        if not self.calibrated:
            return []
        if self.cand_var is None:  # one estimate counted for both trainings: fully correlated, one df
            return [((1.0 + 1.0 / self.candidate_seeds) * self.seed_var, self.n_seeds - 1)]
        return [(self.seed_var, self.n_seeds - 1), (self.cand_var / self.candidate_seeds, self.cand_n - 1)]

    @property
    def se(self) -> float:
        return math.sqrt(self.item_se**2 + sum(v for v, _ in self.parts()))

    @property
    def df(self) -> float:
        return welch_df(self.item_se, self.parts())


def noise_model(metric: str, item_se: float, noise: SeedNoise | None,
                default_margin: float | None = None, run_noise: SeedNoise | None = None,
                candidate_seeds: int = 1) -> NoiseModel:
    """The calibrated noise of a metric, or the item SE plus the uncalibrated hold margin.

    ``noise``: the champion's calibration (its recipe's seed variance); ``run_noise``: the spread of the
    candidate's own ``candidate_seeds`` seeds (``train.seeds``), whose mean is compared. With both, each
    training is charged its own recipe's variance, SE^2 = SE_item^2 + s_champion^2 + s_candidate^2 / N (the
    candidate may be a different recipe); with one, it stands for both."""
    found = [n for n in (noise, run_noise) if n is not None and n.n_seeds >= 2]
    if len(found) == 2:
        champ, run = found
        return NoiseModel(item_se, champ.seed_var, champ.n_seeds, 0.0, run.seed_var, run.n_seeds, candidate_seeds)
    if found:
        return NoiseModel(item_se, found[0].seed_var, found[0].n_seeds, 0.0, candidate_seeds=candidate_seeds)
    margin = uncalibrated_margin(metric) if default_margin is None else default_margin
    return NoiseModel(item_se, 0.0, 0, margin, candidate_seeds=candidate_seeds)


def one_sided_pvalues(diff: float, se: float, df: float, margin: float) -> tuple[float, float]:
    """(p worse by more than ``margin``, p better) for a difference oriented so that + = candidate better."""
    if se == 0.0:
        return (0.0 if diff < -margin else 1.0), (0.0 if diff > 0 else 1.0)
    return 1.0 - t_sf((diff + margin) / se, df), t_sf(diff / se, df)


def mde(se: float, df: float, alpha: float, power: float = DEFAULT_POWER, test_margin: float = 0.0,
        hold_margin: float = 0.0) -> float:
    """The smallest true difference detected with probability ``power`` by a one-sided test at ``alpha`` that
    also requires the observed difference to exceed ``hold_margin`` (see the module docstring)."""
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError("alpha and power must lie in (0, 1)")
    return max(hold_margin, test_margin + t_quantile(1.0 - alpha, df) * se) + t_quantile(power, df) * se


def detectable(model: NoiseModel, alpha: float, n_metrics: int, test_margin: float,
               power: float = DEFAULT_POWER) -> tuple[float, float]:
    """(MDE of an improvement, MDE of a regression) for one metric of an ``n_metrics``-metric gate."""
    a = alpha / max(1, n_metrics)
    return (mde(model.se, model.df, a, power, 0.0, model.hold_margin),
            mde(model.se, model.df, a, power, test_margin, model.hold_margin))
