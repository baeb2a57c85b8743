"""Noise calibrations: what identifies "one config apart from the seed", the per-metric seed noise of N seeds'
evaluations, and finding a config's calibration in the store. No Prefect, no MLflow.

A calibration artifact (stage ``calibrate``) holds ``noise.json``: the config key, the seeds (model digest and
LoggedModel id of each) and, per metric, every seed's value on the same eval items, the between-seed SD and
the RMS paired item-level SE between two seeds.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from codemill.evals.gate import ItemScores
from codemill.evals.noise import SeedNoise, detectable, noise_model, seed_noise
from codemill.evals.stats import paired_difference
from codemill.hashing import stage_digest
from codemill.store import ArtifactRef, ArtifactStore, Manifest

STAGE = "calibrate"
NAME = "noise"
CODE_VERSION = "calibrate-v1"
NOISE_FILE = "noise.json"
SEED_KEY = "seed"


def config_key(code_version: str, config: Mapping[str, Any], input_digests: Mapping[str, str]) -> str:
    """The digest of a train stage with its seed left out: two trainings with equal keys differ only in the
    seed (same data, model, optimiser, steps, code version)."""
    return stage_digest("train-apart-from-seed", code_version, {k: v for k, v in config.items() if k != SEED_KEY},
                        dict(input_digests))


def manifest_key(m: Manifest) -> str:
    return config_key(m.code_version, m.config, m.inputs)


def train_manifest(store: ArtifactStore, digest: str) -> Manifest | None:
    """The committed train artifact with this digest, if it is in this store."""
    for ref in store.list("train"):
        if ref.digest == digest and store.is_committed(ref):
            return store.read_manifest(ref)
    return None


def seeds_of_key(store: ArtifactStore, key: str) -> dict[int, Manifest]:
    """Every committed train artifact of this config apart from the seed, by seed."""
    out: dict[int, Manifest] = {}
    for ref in store.list("train"):
        if not store.is_committed(ref):
            continue
        m = store.read_manifest(ref)
        if SEED_KEY in m.config and manifest_key(m) == key:
            out.setdefault(int(m.config[SEED_KEY]), m)
    return out


def metric_value(s: ItemScores) -> float:
    return float(s.values.sum() / s.weights.sum())


def calibrate(per_seed: Sequence[Mapping[str, ItemScores]]) -> dict[str, SeedNoise]:
    """Each metric all seeds were scored on: every seed's value and the RMS paired item SE over seed pairs."""
    if len(per_seed) < 2:
        raise ValueError(f"a calibration needs at least 2 seeds, got {len(per_seed)}")
    metrics = sorted(set.intersection(*(set(s) for s in per_seed)))
    out: dict[str, SeedNoise] = {}
    for name in metrics:
        scores = [s[name] for s in per_seed]
        ses = []
        for a, b in itertools.combinations(scores, 2):
            ids, ia, ib = _common(a, b)
            ses.append(paired_difference(a.values[ia], b.values[ib], weights=a.weights[ia], clusters=a.clusters[ia],
                                         higher_is_better=a.higher_is_better).se)
        out[name] = seed_noise(name, [metric_value(s) for s in scores], ses)
    return out


def _common(a: ItemScores, b: ItemScores):
    import numpy as np

    return np.intersect1d(a.item_ids, b.item_ids, return_indices=True)


def summary_rows(noise: Mapping[str, SeedNoise], alpha: float, margins: Mapping[str, float]) -> list[dict[str, Any]]:
    """Per metric what a researcher reads before a run: seed SD, item SE, the SE of a comparison of two
    independent trainings and the MDE of an improvement / a regression at 80% power (alpha / m, m metrics)."""
    rows = []
    for name, n in noise.items():
        nm = noise_model(name, n.item_se, n)
        better, worse = detectable(nm, alpha, len(noise), margins.get(name, 0.0))
        rows.append({"metric": name, "n_seeds": n.n_seeds, "mean": sum(n.values) / n.n_seeds, "seed_sd": n.seed_sd,
                     "item_se": n.item_se, "se_total": nm.se, "mde_better": better, "mde_worse": worse})
    return rows


def find_calibration(store: ArtifactStore, key: str) -> tuple[ArtifactRef, dict[str, Any]] | None:
    """The calibration of this config key with the most seeds (the newest among equals), if any."""
    best: tuple[tuple[int, str], ArtifactRef, dict[str, Any]] | None = None
    for ref in store.list(STAGE):
        if not store.is_committed(ref):
            continue
        m = store.read_manifest(ref)
        if m.config.get("config_key") != key:
            continue
        with store.open_file(ref, NOISE_FILE, "r") as fh:
            payload = json.load(fh)
        rank = (len(payload.get("seeds", [])), str(m.created_at))
        if best is None or rank > best[0]:
            best = (rank, ref, payload)
    return (best[1], best[2]) if best else None


def noise_of(payload: Mapping[str, Any]) -> dict[str, SeedNoise]:
    return {k: SeedNoise.from_dict(v) for k, v in payload["metrics"].items()}


def calibration_for_model(store: ArtifactStore, model_digest: str | None) -> tuple[ArtifactRef, dict[str, Any]] | None:
    """The calibration of the config a store train artifact was trained with (None: not a store train
    artifact here, or never calibrated)."""
    m = train_manifest(store, model_digest) if model_digest else None
    return find_calibration(store, manifest_key(m)) if m is not None else None
