"""What the gate decides on, collected one way for the gate task (candidate vs champion) and ``codemill compare``
(a vs b): per metric, the two models' paired item scores, and what is known of the reference's seed noise with
where it came from (``NoiseSource``).

A candidate trained with several seeds (``train.seeds``) is the per-item mean of their scores, with their spread
as the candidate's own seed noise (``noise.noise_model`` charges each training its own variance). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from codemill.evals.stats import ItemScores
from codemill.gate.noise import SeedNoise
from codemill.gate.scores import mean_scores, spread

# Where the reference's seed noise came from: a calibration in the store (``codemill calibrate``), the noise a
# preset of the same recipe ships, both (for different metrics), or neither (uncalibrated: hold margins).
Source = Literal["calibration", "preset", "calibration+preset", "none"]


@dataclass(frozen=True)
class GateMetric:
    """A metric the gate tests: the loss it tolerates before a regression, and (when set) the hold margin it uses
    uncalibrated instead of the noise source's (``NoiseSource.hold_margins``, else the metric's floor)."""

    name: str
    margin: float = 0.0
    uncalibrated_margin: float | None = None


@dataclass(frozen=True)
class NoiseSource:
    """What the gate knows of the reference's seed noise, per metric, and its provenance (``calibration.
    noise_source`` finds it): ``metrics`` holds the calibrated metrics' between-seed noise, ``uri`` where it came
    from (the calibration artifact, the shipped preset); every other metric is uncalibrated, with the hold margin
    of ``hold_margins`` (derived from the seed noise of preset ``hold_margins_from``), else its floor.
    ``advice`` is the command that would calibrate the reference's recipe (``recipe_key``)."""

    source: Source = "none"
    metrics: Mapping[str, SeedNoise] = field(default_factory=dict)
    uri: str | None = None
    hold_margins: Mapping[str, float] = field(default_factory=dict)
    hold_margins_from: str | None = None
    advice: str = "codemill calibrate"
    recipe_key: str | None = None


@dataclass(frozen=True)
class Evidence:
    """The gate's input: per tested metric, the candidate's scores (the mean of ``candidate_seeds`` seeds' models,
    whose spread is ``run_noise``) and the reference's, on the items both were scored on; and the noise source."""

    candidate: Mapping[str, ItemScores]
    reference: Mapping[str, ItemScores]
    metrics: tuple[GateMetric, ...]
    noise: NoiseSource
    run_noise: Mapping[str, SeedNoise] = field(default_factory=dict)
    candidate_seeds: int = 1


def collect(candidate: Sequence[Mapping[str, ItemScores]], reference: Mapping[str, ItemScores],
            metrics: Sequence[GateMetric], noise: NoiseSource | None = None) -> Evidence:
    """The evidence on those of ``metrics`` both models were scored on. ``candidate``: each seed's scores (one
    for a single training). Raises when no metric was scored for both."""
    scores = candidate[0] if len(candidate) == 1 else mean_scores(candidate)
    tested = tuple(m for m in metrics if m.name in scores and m.name in reference)
    if not tested:
        raise ValueError(f"no gate metric was evaluated for both models (configured: "
                         f"{[m.name for m in metrics]}, evaluated: {sorted(scores)})")
    return Evidence(scores, reference, tested, noise or NoiseSource(),
                    spread(candidate) if len(candidate) > 1 else {}, len(candidate))
