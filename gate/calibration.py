"""Noise calibrations: which trainings are seeds of one another, which calibration applies to a model, and the
gate's noise source: a calibration in the store, else a preset's shipped noise (``noise_source``). The seed noise
of N seeds' evaluations is ``scores.calibrate``. No Prefect, no MLflow.

Two keys, for two questions:

- the **config key** (``config_key``): the train stage's digest with the seed left out. Trainings with equal
  keys differ only in the seed (same data, weights to start from, model, optimiser, steps, code version):
  ``codemill calibrate`` reuses them as seeds.
- the **recipe key** (``recipe_key``): the configs and code versions of the chain that made a model (ingest,
  tokenizer, tokens, train) with the seed, the starting weights (``init_from``) and the data's content left
  out. It says "trained the same way", so a calibration keyed by it applies to tomorrow's model of the same
  recipe: the nightly chain, which fine-tunes from a new champion on a grown corpus every night, stays
  calibrated. What kind of model a training starts from (none: scratch; else the architecture of the
  weights, ``start_fingerprint``) is part of the recipe.

A calibration artifact (stage ``calibrate``) holds ``noise.json``: both keys, the digests of the suite configs
it was evaluated with, the seeds (model digest and LoggedModel id of each) and, per metric, every seed's value
on the same eval items, the between-seed SD and the RMS paired item-level SE between two seeds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from codemill.gate import preset_noise as pn
from codemill.gate.evidence import NoiseSource, Source
from codemill.gate.noise import SeedNoise, detectable, noise_model
from codemill.hashing import stage_digest
from codemill.store import ArtifactRef, ArtifactStore, Manifest

STAGE = "calibrate"
NAME = "noise"
CODE_VERSION = "calibrate-v2"
NOISE_FILE = "noise.json"
SEED_KEY = "seed"


def config_key(code_version: str, config: Mapping[str, Any], input_digests: Mapping[str, str]) -> str:
    """The digest of a train stage with its seed left out: two trainings with equal keys differ only in the
    seed (same data, model, optimiser, steps, code version)."""
    return stage_digest("train-apart-from-seed", code_version, {k: v for k, v in config.items() if k != SEED_KEY},
                        dict(input_digests))


# Config entries that vary between trainings of one recipe: the seed, the starting weights (and the tokenizer
# folder they bring). Source fingerprints (the data's content) are inputs, never part of a recipe.
VOLATILE_KEYS: dict[str, tuple[str, ...]] = {"train": ("seed", "init_from"), "tokenizer": ("base_tokenizer",)}
RECIPE_VERSION = "recipe-v1"
# Input name of a stage -> (stage, artifact name) of the artifact it names.
UPSTREAM: dict[str, tuple[str, str]] = {"tokens": ("tokenize", "tokens"), "tokenizer": ("tokenizer", "tokenizer"),
                                        "corpus": ("ingest", "corpus")}
RECIPE_STAGES = ("ingest", "tokenizer", "tokenize", "train")


# What a recipe keeps of its starting weights: the kind of model, from its config.json.
START_KEYS = ("model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "vocab_size", "tie_word_embeddings")


def start_fingerprint(init_from: str | None) -> dict[str, Any] | None:
    """What kind of model a training starts from, not which weights: tonight's and tomorrow's champions share
    it, a 125M and a 1B base model do not. The architecture in a local folder's config.json; the name itself
    for a hub model (or a folder without one). None: from scratch."""
    if not init_from:
        return None
    config = Path(init_from).expanduser() / "config.json"
    if config.is_file():
        arch = json.loads(config.read_text())
        return {k: arch[k] for k in START_KEYS if k in arch}
    return {"name": init_from}


def stage_recipe(stage: str, code_version: str, config: Mapping[str, Any], input_names: Sequence[str]) -> dict:
    """One stage of a recipe: its code version, its config less the volatile keys, the names (not the digests)
    of the artifacts it was made from (source fingerprints left out)."""
    drop = VOLATILE_KEYS.get(stage, ())
    return {"code_version": code_version, "config": {k: v for k, v in config.items() if k not in drop},
            "inputs": sorted(n for n in input_names if not n.startswith("source."))}


def recipe_key(recipe: Mapping[str, Any]) -> str:
    return stage_digest("recipe", RECIPE_VERSION, dict(recipe), {})


def recipe_of_plans(plans: Sequence[Any]) -> dict[str, Any]:
    """The recipe of a planned training, from the StagePlans of its chain (ingest, tokenizer, tokenize, train)."""
    by_stage = {p.stage: p for p in plans if p.stage in RECIPE_STAGES}
    missing = [s for s in RECIPE_STAGES if s not in by_stage]
    if missing:
        raise ValueError(f"a recipe needs the plans of {list(RECIPE_STAGES)}; missing {missing}")
    out: dict[str, Any] = {s: stage_recipe(s, p.code_version, p.config, list(p.inputs)) for s, p in by_stage.items()}
    out["start"] = start_fingerprint(by_stage["train"].config.get("init_from"))
    return out


def recipe_of_model(store: ArtifactStore, train: Manifest) -> dict[str, Any] | None:
    """The recipe of a committed training, walked from its manifest up its chain in the store (None when a
    link of the chain is not in this store)."""
    out: dict[str, Any] = {"train": stage_recipe("train", train.code_version, train.config, list(train.inputs)),
                           "start": start_fingerprint(train.config.get("init_from"))}
    frontier = [train]
    while frontier:
        m = frontier.pop()
        for name, digest in m.inputs.items():
            if name not in UPSTREAM or UPSTREAM[name][0] in out:
                continue
            stage, artifact = UPSTREAM[name]
            ref = store.ref(stage, artifact, digest)
            if not store.is_committed(ref):
                return None
            up = store.read_manifest(ref)
            out[stage] = stage_recipe(stage, up.code_version, up.config, list(up.inputs))
            frontier.append(up)
    return out if all(s in out for s in RECIPE_STAGES) else None


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
    """The calibration of this recipe key with the most seeds (the newest among equals), if any."""
    best: tuple[tuple[int, str], ArtifactRef, dict[str, Any]] | None = None
    for ref in store.list(STAGE):
        if not store.is_committed(ref):
            continue
        m = store.read_manifest(ref)
        if m.config.get("recipe_key") != key:
            continue
        with store.open_file(ref, NOISE_FILE, "r") as fh:
            payload = json.load(fh)
        rank = (len(payload.get("seeds", [])), str(m.created_at))
        if best is None or rank > best[0]:
            best = (rank, ref, payload)
    return (best[1], best[2]) if best else None


def noise_of(payload: Mapping[str, Any]) -> dict[str, SeedNoise]:
    return {k: SeedNoise.from_dict(v) for k, v in payload["metrics"].items()}


def model_recipe(store: ArtifactStore, model_digest: str | None) -> dict[str, Any] | None:
    """The recipe of a store train artifact (None: not a train artifact of this store, or its chain is not)."""
    m = train_manifest(store, model_digest) if model_digest else None
    return recipe_of_model(store, m) if m is not None else None


def calibrate_command(recipe: Mapping[str, Any] | None, seeds: int = 10) -> str:
    """The command that calibrates a champion of this recipe: a fine-tuned one is calibrated by fine-tuning
    seeds from the champion (the nightly chain), a scratch one by training seeds of its config."""
    return f"codemill calibrate --seeds {seeds}" + (" --from-champion" if recipe and recipe.get("start") else "")


def calibrated_metrics(payload: Mapping[str, Any], evaluate_config: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics of a calibration whose suite was evaluated with the settings configured now (other settings
    score other items, whose noise this is not)."""
    return pn.same_suite_settings(payload["metrics"], payload.get("suite_digests") or {}, evaluate_config)


def noise_source(store: ArtifactStore, reference_digest: str | None, evaluate_config: Mapping[str, Any],
                 metrics: Sequence[str], config_recipes: Sequence[str] = ()) -> NoiseSource:
    """What the gate knows of the reference's (the champion's) seed noise, per metric, first found first:

    1. a calibration of the reference's recipe in this store (``codemill calibrate``);
    2. the noise shipped with a preset of the same recipe and suite settings;
    3. none: the metric is uncalibrated, with a hold margin from the nearest measured preset.

    ``config_recipes``: the recipe keys that ``codemill calibrate`` of this run's config would measure (from
    scratch, and from the champion); when the reference's is not among them the advice says so."""
    recipe = model_recipe(store, reference_digest)
    key = recipe_key(recipe) if recipe is not None else None
    presets = pn.load_preset_noise()
    advice = calibrate_command(recipe)
    if key and config_recipes and key not in config_recipes:
        advice += " with the champion's config"
    found = find_calibration(store, key) if key else None
    own = noise_of({"metrics": calibrated_metrics(found[1], evaluate_config)}) if found else {}
    shipped = pn.matching(presets, key, evaluate_config)
    borrowed = {m: n for m, n in (shipped[1] if shipped else {}).items() if m not in own}
    labels = ([found[0].uri] if found and own else []) + ([shipped[0].label] if shipped and borrowed else [])
    source: Source = ("calibration+preset" if own and borrowed else "calibration" if own else "preset" if borrowed
                      else "none")
    near = pn.nearest(presets, recipe["train"]["config"] if recipe else None)
    calibrated = {**own, **borrowed}
    return NoiseSource(source, calibrated, "; ".join(labels) or None,
                       pn.hold_margins(near, [m for m in metrics if m not in calibrated], len(metrics)),
                       near.preset if near else None, advice, key)
