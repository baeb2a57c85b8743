"""Several seeds' scores of one metric: each seed's value, their mean per item (the candidate of a
``train.seeds`` run), their spread and their seed noise with the paired item-level SE (a calibration). Pure."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from codemill.evals.stats import ItemScores, paired_difference
from codemill.gate.noise import SeedNoise, seed_noise


def metric_value(s: ItemScores) -> float:
    return float(s.values.sum() / s.weights.sum())


def shared_metrics(per_seed: Sequence[Mapping[str, ItemScores]]) -> list[str]:
    """The metrics every seed was scored on, in order."""
    return sorted(set.intersection(*(set(s) for s in per_seed)))


def calibrate(per_seed: Sequence[Mapping[str, ItemScores]]) -> dict[str, SeedNoise]:
    """Each metric all seeds were scored on: every seed's value and the RMS paired item SE over seed pairs."""
    if len(per_seed) < 2:
        raise ValueError(f"a calibration needs at least 2 seeds, got {len(per_seed)}")
    out: dict[str, SeedNoise] = {}
    for name in shared_metrics(per_seed):
        scores = [s[name] for s in per_seed]
        ses = []
        for a, b in itertools.combinations(scores, 2):
            ids, ia, ib = _common(a, b)
            ses.append(paired_difference(a.values[ia], b.values[ib], weights=a.weights[ia], clusters=a.clusters[ia],
                                         higher_is_better=a.higher_is_better).se)
        out[name] = seed_noise(name, [metric_value(s) for s in scores], ses)
    return out


def spread(per_seed: Sequence[Mapping[str, ItemScores]]) -> dict[str, SeedNoise]:
    """Each metric's between-seed spread of its value (no paired item SEs: only the variance is needed, and
    ``train.seeds`` may be large)."""
    return {m: seed_noise(m, [metric_value(s[m]) for s in per_seed]) for m in shared_metrics(per_seed)}


def _common(a: ItemScores, b: ItemScores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.intersect1d(a.item_ids, b.item_ids, return_indices=True)


def mean_scores(per_seed: Sequence[Mapping[str, ItemScores]]) -> dict[str, ItemScores]:
    """Per metric, the per-item mean over seeds' models on the items all of them were scored on: the
    candidate of a ``train.seeds`` run."""
    out: dict[str, ItemScores] = {}
    for name in shared_metrics(per_seed):
        scores = [s[name] for s in per_seed]
        common = scores[0].item_ids
        for sc in scores[1:]:
            common = np.intersect1d(common, sc.item_ids)
        # each seed's row of every common item, in the (sorted) order of ``common``
        rows = [np.intersect1d(common, sc.item_ids, return_indices=True)[2] for sc in scores]
        first = scores[0]
        out[name] = ItemScores(common, np.mean([sc.values[r] for sc, r in zip(scores, rows, strict=True)], axis=0),
                               first.weights[rows[0]], first.clusters[rows[0]], first.higher_is_better,
                               first.binary and len(scores) == 1)  # a mean of pass/fail is not pass/fail
    return out
