"""Stage plans: the digest, the manifest and the pipeline's step list all come from one value per stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from codemill.config import load_preset
from codemill.evals.config import EvalConfig
from codemill.flows.plan import PHASES, describe, plan_pipeline
from codemill.plan import StagePlan, manifest_digest
from codemill.store import ArtifactStore
from codemill.tasks.evaluate import plan_suite
from codemill.tasks.tokenize import TOKENS_KEYS

SOURCES = [{"kind": "folder", "root": "/src/a", "repo": "a", "fingerprint": "f" * 64, "commit": None}]


def _store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(str(tmp_path / "store"), cache_dir=tmp_path / "cache")


def _steps(tmp_path: Path, cfg=None, until: str = "evaluate"):
    return plan_pipeline(cfg or load_preset("tiny"), SOURCES, _store(tmp_path), until)


def test_a_written_manifest_states_exactly_the_plan(tmp_path: Path) -> None:
    """The tokenize digest hashes TOKENS_KEYS only; its manifest used to store the whole tokenize config."""
    store = _store(tmp_path)
    steps = {s.key: s for s in _steps(tmp_path)}
    plan = steps["tokenize"].plan
    assert set(plan.config) == set(TOKENS_KEYS)
    with store.writer(plan) as w:
        w.path("x.bin").write_bytes(b"tokens")
        w.finish({"tokens": 1})
    m = store.read_manifest(store.ref_for(plan))
    assert m.config == plan.config and m.inputs == plan.input_digests
    assert manifest_digest(m) == m.digest == plan.digest
    assert m.input_uris == {k: v.uri for k, v in plan.inputs.items()}


def test_manifest_digest_notices_a_manifest_that_misstates_its_config() -> None:
    from codemill.store import Manifest

    plan = StagePlan(stage="s", name="n", code_version="v1", config={"a": 1})
    honest = Manifest(stage="s", name="n", digest=plan.digest, uri="u", code_version="v1", config={"a": 1})
    lying = honest.model_copy(update={"config": {"a": 1, "extra": 2}})
    assert manifest_digest(honest) == plan.digest
    assert manifest_digest(lying) != plan.digest


def test_an_evaluation_does_not_depend_on_which_other_suites_ran(tmp_path: Path) -> None:
    """The eval digest hashes one suite's config; two evaluations that differ only in the suite list must be
    the same artifact with the same manifest config, so ``codemill compare`` pairs them."""
    store = _store(tmp_path)
    model = store.ref("train", "model", "1" * 64)
    corpus = store.ref("ingest", "corpus", "2" * 64)
    alone = plan_suite("bpb", EvalConfig(suites=["bpb"]), model, corpus)
    beside = plan_suite("bpb", EvalConfig(suites=["bpb", "completion", "humaneval"]), model, corpus)
    assert alone == beside and alone.digest == beside.digest
    assert "suites" not in alone.config
    changed = plan_suite("bpb", EvalConfig(suites=["bpb"], bpb={"max_files": 7}), model, corpus)
    assert changed.digest != alone.digest


def test_the_sampling_engine_reaches_the_generating_suites_only(tmp_path: Path) -> None:
    """``evaluate.engine: vllm`` is a new evaluation of the suites that generate (vLLM's samples are not the
    HF engine's), and of no other; the default engine adds nothing, so earlier evaluations keep their digests."""
    store = _store(tmp_path)
    model = store.ref("train", "model", "1" * 64)
    corpus = store.ref("ingest", "corpus", "2" * 64)
    hf, vllm = EvalConfig(), EvalConfig(engine="vllm", vllm={"dtype": "float32"})
    for suite in ("completion", "humaneval", "humaneval_infilling"):
        a, b = plan_suite(suite, hf, model, corpus), plan_suite(suite, vllm, model, corpus)
        assert "engine" not in a.config and b.config["engine"] == "vllm" and a.digest != b.digest, suite
        bf16 = plan_suite(suite, EvalConfig(engine="vllm"), model, corpus)
        assert bf16.digest != b.digest, suite  # the dtype changes vLLM's numbers
    for suite in ("bpb", "latency"):
        assert plan_suite(suite, hf, model, corpus).digest == plan_suite(suite, vllm, model, corpus).digest
    assert "engine" not in hf.digest_config() and "vllm" not in hf.digest_config()


def test_until_keeps_a_prefix_of_the_same_steps(tmp_path: Path) -> None:
    full = _steps(tmp_path)
    assert [s.key for s in full] == ["ingest", "tokenizer", "tokenize", "train", "augment", "eval:bpb",
                                     "eval:completion", "eval:humaneval", "eval:humaneval_infilling",
                                     "eval:latency"]
    expected = {"ingest": 1, "tokenize": 3, "train": 4, "evaluate": 10}
    for until in PHASES:
        prefix = _steps(tmp_path, until=until)
        assert [s.plan.digest for s in prefix] == [s.plan.digest for s in full[: expected[until]]]
    with pytest.raises(ValueError, match="until must be one of"):
        _steps(tmp_path, until="deploy")


def test_steps_chain_through_their_inputs(tmp_path: Path) -> None:
    store = _store(tmp_path)
    steps = {s.key: s.plan for s in _steps(tmp_path)}
    assert steps["tokenizer"].inputs["corpus"] == store.ref_for(steps["ingest"])
    assert steps["tokenize"].inputs["tokenizer"] == store.ref_for(steps["tokenizer"])
    assert steps["train"].inputs["tokens"] == store.ref_for(steps["tokenize"])
    assert steps["eval:bpb"].inputs == {"model": store.ref_for(steps["train"]), "data": store.ref_for(steps["ingest"])}
    assert steps["ingest"].input_digests == {"source.0.a": "f" * 64}


def test_humaneval_plus_plans_the_augmented_tests_as_an_input_of_the_suite(tmp_path: Path) -> None:
    store = _store(tmp_path)
    steps = {s.key: s.plan for s in _steps(tmp_path)}
    assert steps["eval:humaneval"].inputs["plus"] == store.ref_for(steps["augment"])
    assert "plus" not in steps["eval:bpb"].inputs
    assert steps["augment"].config["max_problems"] == load_preset("tiny").evaluate.humaneval.max_problems
    other = load_preset("tiny")
    other.augment.max_mutants += 1
    changed = {s.key for s in _steps(tmp_path, other) if s.plan.digest != steps[s.key].digest}
    assert changed == {"augment", "eval:humaneval"}
    off = load_preset("tiny")
    off.evaluate.humaneval.plus = False
    plain = {s.key: s.plan for s in _steps(tmp_path, off)}
    assert "augment" not in plain and "plus" not in plain["eval:humaneval"].inputs
    assert plain["eval:humaneval"].digest != steps["eval:humaneval"].digest
    assert plain["eval:bpb"].digest == steps["eval:bpb"].digest


def test_a_config_change_reaches_exactly_the_stages_downstream_of_it(tmp_path: Path) -> None:
    base = {s.key: s.plan.digest for s in _steps(tmp_path)}
    runtime = load_preset("tiny")
    runtime.train.timeout_s += 100  # runtime-only: changes nothing
    runtime.evaluate.humaneval.workers = 7
    assert {s.key: s.plan.digest for s in _steps(tmp_path, runtime)} == base
    longer = load_preset("tiny")
    longer.tokenize.seq_len *= 2
    changed = {s.key for s in _steps(tmp_path, longer) if s.plan.digest != base[s.key]}
    assert changed == {"tokenize", "train", "eval:bpb", "eval:completion", "eval:humaneval",
                       "eval:humaneval_infilling", "eval:latency"}


def test_describe_tells_run_from_skip_and_writes_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    steps = _steps(tmp_path)
    assert [r["action"] for r in describe(steps, store)] == ["run"] * len(steps)
    assert not (tmp_path / "store").exists() and not (tmp_path / "cache").exists()
    with store.writer(steps[0].plan) as w:
        w.path("x").write_text("corpus")
        w.finish()
    rows = describe(steps, store)
    assert rows[0]["action"] == "skip (in store)" and {r["action"] for r in rows[1:]} == {"run"}
    assert rows[0]["uri"] == store.ref_for(steps[0].plan).uri and rows[0]["digest"] == steps[0].plan.digest


def test_train_seeds_plans_the_other_seeds_as_steps_that_share_the_data(tmp_path: Path) -> None:
    from codemill.gate.calibration import recipe_key, recipe_of_plans

    cfg = load_preset("tiny")
    one = {s.key: s for s in _steps(tmp_path, cfg)}
    cfg.train.seeds = 3
    three = {s.key: s for s in _steps(tmp_path, cfg)}
    assert set(three) - set(one) == {f"seed{s}:{k}" for s in (1235, 1236) for k in ("train", *cfg.evaluate.suites)}
    assert one["train"].plan.digest == three["train"].plan.digest  # seeds is not part of any digest
    assert three["seed1235:train"].plan.config["seed"] == 1235
    assert three["seed1235:train"].plan.inputs == three["train"].plan.inputs  # the same tokens
    assert three["seed1236:bpb"].plan.inputs["model"].digest == three["seed1236:train"].plan.digest
    assert "seed1235:train" not in {s.key for s in _steps(tmp_path, cfg, "train")}  # extra seeds exist to be gated
    assert recipe_key(recipe_of_plans([three["seed1236:train"].plan, *(one[k].plan for k in
                                                                      ("ingest", "tokenizer", "tokenize"))])) \
        == recipe_key(recipe_of_plans([s.plan for s in one.values()]))
    rows = describe(list(three.values()), _store(tmp_path))
    assert [r["step"] for r in rows if r["step"].startswith("seed")][:2] == ["seed1235:train", "seed1235:bpb"]
