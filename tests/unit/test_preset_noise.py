"""The noise shipped with the presets and the uncalibrated hold margins derived from it: the recipe key (what a
calibration applies to), the safe margin by hand, matching a champion to a preset, the nearest preset, pooling
a candidate's own seeds, and that every shipped measurement still describes its preset."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from codemill.config import load_preset, preset_names
from codemill.evals.stats import ItemScores
from codemill.evals.suites import SUITE_OF_METRIC
from codemill.flows.plan import config_recipe
from codemill.gate import preset_noise as pn
from codemill.gate.calibration import calibrate_command, recipe_key, recipe_of_plans
from codemill.gate.evidence import GateMetric, NoiseSource, collect
from codemill.gate.noise import UNCALIBRATED_MARGINS, SeedNoise, noise_model, seed_noise
from codemill.gate.policy import decide
from codemill.gate.scores import calibrate, mean_scores
from codemill.plan import StagePlan


def _chain(seed: int = 1, init_from: str | None = None, steps: int = 10, base: str | None = None,
           fingerprint: str = "f0") -> list[StagePlan]:
    from codemill.store import ArtifactRef

    def ref(stage: str, digest: str) -> ArtifactRef:
        return ArtifactRef(stage=stage, name=stage, digest=digest, uri=f"/s/{stage}/{digest}")

    source = ref("external", fingerprint)
    tok_inputs = {"base": ref("external", "b" + (base or ""))} if base else {"corpus": ref("ingest", "c" + fingerprint)}
    return [StagePlan(stage="ingest", name="corpus", code_version="i1", config={"min_lines": 2},
                      inputs={"source.0.stdlib": source}),
            StagePlan(stage="tokenizer", name="tokenizer", code_version="k1",
                      config={"vocab_size": 64, "base_tokenizer": base}, inputs=tok_inputs),
            StagePlan(stage="tokenize", name="tokens", code_version="t1", config={"seq_len": 8},
                      inputs={"corpus": ref("ingest", "c" + fingerprint)}),
            StagePlan(stage="train", name="model", code_version="m1",
                      config={"seed": seed, "init_from": init_from, "max_steps": steps},
                      inputs={"tokens": ref("tokenize", "t" + fingerprint)})]


def test_recipe_leaves_out_seed_starting_weights_and_data_content_only(tmp_path):
    key = recipe_key(recipe_of_plans(_chain()))
    assert key == recipe_key(recipe_of_plans(_chain(seed=7)))
    assert key == recipe_key(recipe_of_plans(_chain(fingerprint="grown-corpus")))
    assert key != recipe_key(recipe_of_plans(_chain(steps=11)))
    arch = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 4, "vocab_size": 4096}
    folders = {}
    for name, hidden in (("tonight", 128), ("tomorrow", 128), ("bigger", 512)):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "config.json").write_text(json.dumps({**arch, "hidden_size": hidden, "name_or_path": name}))

    def fine(name: str, seed: int = 1) -> dict:
        return recipe_of_plans(_chain(seed=seed, init_from=str(folders[name]), base=str(folders[name])))

    assert fine("tonight")["start"] == {**arch, "hidden_size": 128}
    assert recipe_key(fine("tonight")) == recipe_key(fine("tomorrow", seed=3))  # a new champion, same recipe
    assert recipe_key(fine("tonight")) != recipe_key(fine("bigger"))  # other kind of starting weights
    assert recipe_key(fine("tonight")) != key  # a fine-tune is not a scratch training
    assert recipe_of_plans(_chain(init_from="org/base-model"))["start"] == {"name": "org/base-model"}
    assert calibrate_command(fine("tonight")) == "codemill calibrate --seeds 10 --from-champion"
    assert calibrate_command(None) == "codemill calibrate --seeds 10"
    with pytest.raises(ValueError, match="missing"):
        recipe_of_plans(_chain()[1:])


def test_safe_hold_margin_by_hand():
    n = seed_noise("val_bpb", [2.3, 2.4, 2.5, 2.6, 2.2, 2.45, 2.35, 2.55, 2.25, 2.5])
    upper = n.seed_sd * math.sqrt(9 / stats.chi2.ppf(0.05, 9))  # 95% upper bound of the SD
    assert pn.safe_hold_margin(n) == pytest.approx(stats.norm.ppf(0.975) * math.sqrt(2) * upper)
    assert pn.safe_hold_margin(n) == pytest.approx(4.56 * n.seed_sd, rel=0.01)
    # a seed-only retrain (difference of two seeds: N(0, 2 s^2)) crosses it rarely even at the SD's upper bound
    assert stats.norm.sf(pn.safe_hold_margin(n) / (math.sqrt(2) * upper)) == pytest.approx(0.025)
    with pytest.raises(ValueError):
        pn.safe_hold_margin(SeedNoise("m", (1.0,)))


def _preset(name: str, train: dict, sd: float, metric: str = "val_bpb") -> pn.PresetNoise:
    values = [2.0 + sd * z for z in (-1.5, -0.5, 0.0, 0.5, 1.5)]
    return pn.PresetNoise(name, f"key-{name}", pn.suite_digests({"bpb": {"max_files": 3}, "seed": 0}), train,
                          {metric: seed_noise(metric, values)}, {"date": "2026-12-06", "commit": "abc"})


def test_hold_margins_come_from_the_nearest_measured_preset_and_never_go_below_the_floor():
    small = _preset("small", {"max_steps": 150, "lr": 0.003, "model": {"hidden_size": 128}}, 0.1)
    big = _preset("big", {"max_steps": 2000, "lr": 0.001, "model": {"hidden_size": 512}}, 0.01)
    unmeasured = pn.PresetNoise("gpu", "key-gpu", {}, {"max_steps": 150, "lr": 0.003,
                                                       "model": {"hidden_size": 128}}, {}, None, "no GPU")
    presets = [small, big, unmeasured]
    assert pn.nearest(presets, {"max_steps": 150, "lr": 0.003, "model": {"hidden_size": 256}}) is small
    assert pn.nearest(presets, {"max_steps": 2000, "lr": 0.001, "model": {"hidden_size": 128}}) is big
    assert pn.nearest(presets, None) is small  # unknown config: the noisiest measurement
    assert pn.nearest([unmeasured], {}) is None
    margins = pn.hold_margins(small, ["val_bpb", "humaneval_pass_at_1"])
    assert margins["val_bpb"] == pytest.approx(pn.safe_hold_margin(small.metrics["val_bpb"], n_metrics=2))
    # Bonferroni over the gate's metrics: two margins are each wider than one would be
    assert pn.safe_hold_margin(small.metrics["val_bpb"], 2) / pn.safe_hold_margin(small.metrics["val_bpb"]) \
        == pytest.approx(stats.norm.ppf(1 - 0.025 / 2) / stats.norm.ppf(0.975))
    assert margins["humaneval_pass_at_1"] == UNCALIBRATED_MARGINS["humaneval_pass_at_1"]  # not measured: floor
    assert pn.hold_margins(big, ["val_bpb"])["val_bpb"] == UNCALIBRATED_MARGINS["val_bpb"]  # quiet: floor
    assert pn.hold_margins(small, ["val_bpb"], n_metrics=3)["val_bpb"] == pytest.approx(
        pn.safe_hold_margin(small.metrics["val_bpb"], 3))
    assert pn.hold_margins(None, ["val_bpb"]) == {"val_bpb": UNCALIBRATED_MARGINS["val_bpb"]}


def test_a_champion_matches_a_preset_by_recipe_and_suite_config():
    p = _preset("small", {}, 0.1)
    same_eval = {"bpb": {"max_files": 3}, "seed": 0}
    assert pn.matching([p], "key-small", same_eval)[1].keys() == {"val_bpb"}
    assert pn.matching([p], "key-other", same_eval) is None
    assert pn.matching([p], None, same_eval) is None
    assert pn.matching([p], "key-small", {"bpb": {"max_files": 4}, "seed": 0}) is None  # other items
    assert pn.PresetNoise.from_dict(p.as_dict()) == p


def _scores(shift: float, n: int = 300, seed: int = 0, item_noise: float = 0.01) -> dict[str, ItemScores]:
    rng = np.random.default_rng(seed)
    ids, w = np.array([f"f{i:03d}" for i in range(n)]), np.full(n, 1000.0)
    return {"val_bpb": ItemScores(ids, w * (2.5 - shift + item_noise * rng.normal(size=n)), w, np.arange(n), False)}


def test_candidate_seeds_are_averaged_and_their_spread_pooled_with_the_calibration():
    per_seed = [_scores(s, seed=i) for i, s in enumerate((0.10, 0.12, 0.14))]
    mean = mean_scores(per_seed)["val_bpb"]
    assert mean.values.sum() / mean.weights.sum() == pytest.approx(2.5 - 0.12, abs=0.002)
    shuffled = {"val_bpb": ItemScores(*(a[::-1] for a in (per_seed[2]["val_bpb"].item_ids,
                                                          per_seed[2]["val_bpb"].values,
                                                          per_seed[2]["val_bpb"].weights,
                                                          per_seed[2]["val_bpb"].clusters)), False)}
    again = mean_scores([*per_seed[:2], shuffled])["val_bpb"]  # aligned by item id, not by position
    assert np.allclose(again.values, mean.values)
    run = calibrate(per_seed)["val_bpb"]
    shipped = seed_noise("val_bpb", [2.3, 2.4, 2.5, 2.35, 2.45])
    # the champion's training is charged its calibration's variance, the candidate's mean its own spread / 3
    both = noise_model("val_bpb", 0.01, shipped, run_noise=run, candidate_seeds=3)
    parts = [shipped.seed_var, run.seed_var / 3]
    assert both.se == pytest.approx(math.sqrt(0.01**2 + sum(parts)))
    assert both.df == pytest.approx((0.01**2 + sum(parts)) ** 2 / (parts[0] ** 2 / 4 + parts[1] ** 2 / 2))
    assert both.n_seeds == 5 and both.cand_n == 3
    alone = noise_model("val_bpb", 0.01, None, run_noise=run, candidate_seeds=3)  # its spread stands for both
    assert alone.calibrated and alone.n_seeds == 3 and alone.hold_margin == 0.0
    assert alone.se == pytest.approx(math.sqrt(0.01**2 + (1 + 1 / 3) * run.seed_var))
    assert alone.df == pytest.approx((0.01**2 + 4 / 3 * run.seed_var) ** 2 / ((4 / 3 * run.seed_var) ** 2 / 2))
    champion = _scores(0.0, seed=9)
    v = decide(collect(per_seed, champion, [GateMetric("val_bpb", 0.01)]))
    (e,) = v.metrics
    assert v.calibrated and e.n_seeds == 3 and e.candidate_seeds == 3 and e.candidate_seed_sd is None
    assert e.se == pytest.approx(math.sqrt(e.se_item**2 + 4 / 3 * run.seed_var))
    (e2,) = decide(collect(per_seed, champion, [GateMetric("val_bpb", 0.01)],
                           NoiseSource("preset", {"val_bpb": shipped}))).metrics
    assert e2.n_seeds == 5 and e2.candidate_seed_sd == pytest.approx(run.seed_sd)
    assert e2.seed_sd == pytest.approx(shipped.seed_sd)


def test_an_uncalibrated_verdict_names_the_command_that_calibrates():
    cand, champ = _scores(0.05, seed=1), _scores(0.0, seed=2)
    held = NoiseSource(hold_margins={"val_bpb": 0.5}, advice="codemill calibrate --seeds 10 --from-champion")
    v = decide(collect([cand], champ, [GateMetric("val_bpb", 0.01)], held))
    (e,) = v.metrics
    assert v.verdict == "hold" and e.hold_margin == 0.5
    assert "uncalibrated: needs `codemill calibrate --seeds 10 --from-champion`" in v.reason
    # a metric's own configured margin wins over the derived one
    assert decide(collect([cand], champ, [GateMetric("val_bpb", 0.01, 0.02)], held)).verdict == "promote"


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_ships_a_measurement_of_its_current_config(name):
    """Change a preset's training, data or suite settings (or a stage's code version) and this fails until
    ``python -m benchmarks.preset_noise --preset <name> --write`` measures it again."""
    (shipped,) = [p for p in pn.load_preset_noise() if p.preset == name]
    cfg = load_preset(name)
    recipe = config_recipe(cfg)
    assert shipped.recipe_key == recipe_key(recipe), f"{name}: the preset's recipe changed since its noise was measured"
    now = pn.suite_digests(cfg.evaluate.digest_config(), shipped.suite_digests)
    assert shipped.suite_digests == now, f"{name}: suite config changed"
    assert {SUITE_OF_METRIC[m] for m in shipped.metrics} <= set(shipped.suite_digests)
    assert shipped.train == recipe["train"]["config"]
    if shipped.measured is None:
        assert shipped.reason and not shipped.metrics
    else:
        assert {"date", "commit", "machine", "command", "seeds", "steps"} <= set(shipped.measured)
        assert shipped.measured["steps"] == cfg.train.max_steps and shipped.n_seeds >= 10
        assert "val_bpb" in shipped.metrics


def test_the_default_preset_is_measured():
    (tiny,) = [p for p in pn.load_preset_noise() if p.preset == "tiny"]
    assert tiny.measured is not None and tiny.metrics["val_bpb"].seed_sd > 0
