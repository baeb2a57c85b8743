"""The pipeline flow end to end: real Prefect (test harness), real MLflow (SQLite), torchrun with 2 gloo ranks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from prefect.settings import PREFECT_TASKS_REFRESH_CACHE, temporary_settings

from codemill.evals import suites
from codemill.evals.suites import EvalModel, SuiteRun, load_eval_model, load_val_files
from codemill.lineage import mlflow_digest
from codemill.models.build import build_model
from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]


@pytest.fixture(scope="module")
def runs(small_corpus, tmp_path_factory):
    from codemill.flows.pipeline import pipeline

    tmp = tmp_path_factory.mktemp("pipeline")
    cfg = small_pipeline_config(small_corpus, tmp, all_suites=True)
    first = pipeline(config=cfg)
    second = pipeline(config=cfg)
    with temporary_settings(updates={PREFECT_TASKS_REFRESH_CACHE: True}):
        third = pipeline(config=cfg)
    return cfg, first, second, third


def _ref(stage_result: dict) -> ArtifactRef:
    return ArtifactRef.model_validate(stage_result["ref"])


def test_every_stage_ran_and_committed_a_manifest(runs):
    cfg, first, _, _ = runs
    store = ArtifactStore(cfg.store_root)
    assert list(first["stages"]) == ["ingest", "tokenizer", "tokenize", "train", "augment", "eval:bpb",
                                     "eval:completion", "eval:humaneval", "eval:humaneval_infilling",
                                     "eval:latency"]
    for name, st in first["stages"].items():
        assert st["status"] == "ran", name
        ref = _ref(st)
        assert store.is_committed(ref)
        manifest = store.read_manifest(ref)
        assert manifest.files and all(f.sha256 and f.bytes > 0 for f in manifest.files)
    root = Path(cfg.store_root)
    assert not list(root.glob("*/.staging-*")), "staging directories left behind"


def test_manifests_repeat_the_chain(runs):
    cfg, first, _, _ = runs
    store = ArtifactStore(cfg.store_root)
    st = {k: _ref(v) for k, v in first["stages"].items()}
    assert store.read_manifest(st["tokenizer"]).inputs == {"corpus": st["ingest"].digest}
    assert store.read_manifest(st["tokenize"]).inputs == {"corpus": st["ingest"].digest,
                                                          "tokenizer": st["tokenizer"].digest}
    assert store.read_manifest(st["train"]).inputs == {"tokens": st["tokenize"].digest,
                                                       "tokenizer": st["tokenizer"].digest}
    for suite in ("bpb", "completion"):
        assert store.read_manifest(st[f"eval:{suite}"]).inputs == {"model": st["train"].digest,
                                                                    "data": st["ingest"].digest}
    assert store.read_manifest(st["eval:humaneval"]).inputs["model"] == st["train"].digest
    assert store.read_manifest(st["eval:humaneval"]).inputs["plus"] == st["augment"].digest
    sources = store.read_manifest(st["ingest"]).stats["source_fingerprints"]
    assert sources[0]["root"] == cfg.ingest.sources[0].path


def test_every_manifest_states_exactly_what_was_hashed(runs):
    """Each committed artifact's digest recomputes from its own manifest's config, inputs and code version."""
    from codemill.plan import manifest_digest
    from tests.integration.store_checks import committed_artifacts

    cfg, _, _, _ = runs
    store = ArtifactStore(cfg.store_root)
    manifests = list(committed_artifacts(store).values())
    assert {m.stage for m in manifests} >= {"ingest", "ingest-chunks", "tokenizer", "tokenize", "train", "evaluate"}
    for m in manifests:
        assert manifest_digest(m) == m.digest, f"{m.stage}:{m.name} manifest does not state what was hashed"


def test_loss_went_down(runs):
    cfg, first, _, _ = runs
    store = ArtifactStore(cfg.store_root)
    train_dir = store.local_path(_ref(first["stages"]["train"]))
    summary = json.loads((train_dir / "train_summary.json").read_text())
    losses = summary["losses"]
    assert len(losses) == cfg.train.max_steps and summary["world_size"] == 2
    # CPU trains with SDPA and the dense document mask (torch has no FlexAttention backward on CPU); recorded
    assert summary["attention"] == store.read_manifest(_ref(first["stages"]["train"])).stats["attention"] == "sdpa"
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5


def test_val_bpb_finite_and_better_than_untrained(runs, tmp_path):
    cfg, first, _, _ = runs
    store = ArtifactStore(cfg.store_root)
    bpb = first["scores"]["val_bpb"]
    assert math.isfinite(bpb) and bpb > 0
    assert first["scores"]["val_bpb_ci_low"] <= bpb <= first["scores"]["val_bpb_ci_high"]
    tok_stats = store.read_manifest(_ref(first["stages"]["tokenize"])).stats
    untrained = build_model(cfg.train.model, tok_stats["vocab_size"], tok_stats["seq_len"], tok_stats["eos_id"],
                            tok_stats["pad_id"], cfg.train.seed)
    trained = load_eval_model(store.local_path(_ref(first["stages"]["train"])) / "hf", torch.device("cpu"))
    corpus = store.local_path(_ref(first["stages"]["ingest"]))
    val = load_val_files(corpus, cfg.evaluate.bpb.max_files)
    base_model = EvalModel(untrained.eval(), trained.tokenizer, torch.device("cpu"))
    _, base = suites.get("bpb").run(SuiteRun(cfg.evaluate, tmp_path, tmp_path.joinpath, corpus_dir=corpus,
                                             loader=lambda _: base_model))
    assert bpb < base["val_bpb"] - 0.2, (bpb, base["val_bpb"])
    rows = store.local_path(_ref(first["stages"]["eval:bpb"])) / "rows" / "bpb.parquet"
    import polars as pl
    per_file = pl.read_parquet(rows)
    assert per_file.height == val.height and per_file["item_id"].n_unique() == val.height
    assert per_file["cluster"].n_unique() < val.height  # files of one package share a cluster


def test_hf_export_loads_with_from_pretrained(runs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg, first, _, _ = runs
    hf = ArtifactStore(cfg.store_root).local_path(_ref(first["stages"]["train"])) / "hf"
    assert (hf / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(str(hf))
    tok = AutoTokenizer.from_pretrained(str(hf))
    ids = tok("def add(a, b):\n    return", return_tensors="pt").input_ids
    assert model(input_ids=ids).logits.shape[-1] == model.config.vocab_size
    assert tok.decode(ids[0]) == "def add(a, b):\n    return"


def test_second_run_skips_every_stage(runs):
    _, first, second, third = runs
    assert {k: v["status"] for k, v in second["stages"].items()} == dict.fromkeys(first["stages"], "cached")
    assert second["model_id"] == first["model_id"] and second["scores"] == first["scores"]
    # With Prefect's cache refreshed the task bodies run, and find every artifact already in the store.
    assert {k: v["status"] for k, v in third["stages"].items()} == dict.fromkeys(first["stages"], "present")
    assert third["model_id"] == first["model_id"]


def test_mlflow_chain_from_eval_metric_to_source_directory(runs):
    cfg, first, second, _ = runs
    client = MlflowClient(cfg.mlflow_tracking_uri)
    st = {k: _ref(v) for k, v in first["stages"].items()}
    eval_run = client.get_run(first["stages"]["eval:bpb"]["run_id"])

    # 1. the eval run read one model; that model's val_bpb metric names the eval run and the dataset
    assert [m.model_id for m in eval_run.inputs.model_inputs] == [first["model_id"]]
    model = client.get_logged_model(eval_run.inputs.model_inputs[0].model_id)
    (metric,) = [m for m in model.metrics if m.key == "val_bpb" and m.run_id == eval_run.info.run_id]
    assert metric.value == pytest.approx(first["scores"]["val_bpb"])
    assert metric.model_id == first["model_id"]
    assert metric.dataset_digest == mlflow_digest(st["ingest"].digest) and metric.dataset_name == "corpus-val"
    eval_inputs = {d.dataset.name: d.dataset for d in eval_run.inputs.dataset_inputs}
    assert eval_inputs["corpus-val"].digest == metric.dataset_digest
    assert json.loads(eval_inputs["corpus-val"].source)["uri"] == f"{st['ingest'].uri}/val"

    # 2. the LoggedModel points at its training run and carries the HF model
    assert model.tags["codemill.digest"] == st["train"].digest
    assert str(model.status) == "READY"
    names = {a.path for a in client.list_logged_model_artifacts(model.model_id)}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= names
    train_run = client.get_run(model.source_run_id)
    assert train_run.data.tags["codemill.stage"] == "train"
    # every committed checkpoint is a LoggedModel of the training run, with its step and training dataset
    ckpts = client.search_logged_models([train_run.info.experiment_id],
                                        filter_string=f"source_run_id = '{train_run.info.run_id}'")
    steps = sorted(int(m.tags["codemill.step"]) for m in ckpts if "codemill.step" in m.tags)
    assert steps == list(range(cfg.train.checkpoint_every, cfg.train.max_steps, cfg.train.checkpoint_every))
    ckpt_metric = [x for m in ckpts if "codemill.step" in m.tags for x in m.metrics][0]
    assert ckpt_metric.dataset_digest == mlflow_digest(st["tokenize"].digest)
    assert "train_loss" in train_run.data.metrics and "tokens_per_s" in train_run.data.metrics

    # 3. the training run's input dataset is the token artifact
    (tokens_in,) = [d for d in train_run.inputs.dataset_inputs
                    if {t.key: t.value for t in d.tags}.get("mlflow.data.context") == "training"]
    assert tokens_in.dataset.digest == mlflow_digest(st["tokenize"].digest)
    assert json.loads(tokens_in.dataset.source)["uri"] == st["tokenize"].uri

    # 4. the tokenize run that produced it read the corpus
    (tok_run,) = client.search_runs([eval_run.info.experiment_id],
                                    f"tags.`codemill.output_digest` = '{st['tokenize'].digest}'")
    (corpus_in,) = [d for d in tok_run.inputs.dataset_inputs if d.dataset.name == "corpus"]
    assert corpus_in.dataset.digest == mlflow_digest(st["ingest"].digest)
    assert json.loads(corpus_in.dataset.source)["uri"] == st["ingest"].uri

    # 5. the ingest run names the source directory and its content fingerprint
    (ing_run,) = client.search_runs([eval_run.info.experiment_id],
                                    f"tags.`codemill.output_digest` = '{st['ingest'].digest}'")
    assert ing_run.data.tags["codemill.source.0.root"] == cfg.ingest.sources[0].path
    assert len(ing_run.data.tags["codemill.source.0.fingerprint"]) == 64

    # 6. all stage runs are children of the flow's parent run, which carries the Prefect flow-run id
    parent = client.get_run(first["parent_run_id"])
    assert parent.data.tags["prefect.flow_run_id"] == first["flow_run_id"]
    for run in (eval_run, train_run, tok_run, ing_run):
        assert run.data.tags["mlflow.parentRunId"] == first["parent_run_id"]
    # the first run's model became the champion; the reruns held it
    assert first["gate"]["verdict"] == "promote" and second["gate"]["verdict"] == "hold"
    champion = client.get_model_version_by_alias(cfg.name, "champion")
    assert champion.tags["codemill.model_id"] == first["model_id"]
    # the rerun's parent records the cached stages and the same model
    rerun = client.get_run(second["parent_run_id"])
    assert rerun.data.tags["codemill.train.status"] == "cached"
    assert rerun.data.tags["codemill.model_id"] == first["model_id"]


def test_plan_after_the_run_skips_every_step_and_writes_nothing(runs, tmp_path):
    """``codemill plan`` on the finished store: every step's digest and artifact as the run made them, all
    skipped; before a run (a fresh store) every step would run; neither touches the store or MLflow."""
    import yaml
    from typer.testing import CliRunner

    from codemill.cli import app

    cfg, first, _, _ = runs
    config_file = tmp_path / "cfg.yaml"
    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    store_before = sorted(p for p in Path(cfg.store_root).rglob("*"))
    out = CliRunner().invoke(app, ["plan", "--config", str(config_file), "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [r["step"] for r in rows] == list(first["stages"])
    for row in rows:
        assert row["action"] == "skip (in store)"
        assert row["digest"] == first["stages"][row["step"]]["ref"]["digest"]
        assert row["uri"] == first["stages"][row["step"]]["ref"]["uri"]
    assert sorted(p for p in Path(cfg.store_root).rglob("*")) == store_before
    fresh = CliRunner().invoke(app, ["plan", "--config", str(config_file), "--json", "--until", "tokenize",
                                     "--store", str(tmp_path / "empty-store")])
    assert fresh.exit_code == 0, fresh.output
    assert [(r["step"], r["action"]) for r in json.loads(fresh.output)] == [
        ("ingest", "run"), ("tokenizer", "run"), ("tokenize", "run")]
    assert not (tmp_path / "empty-store").exists()
    bad = CliRunner().invoke(app, ["plan", "--config", str(config_file), "--until", "deploy"])
    assert bad.exit_code == 2 and "deploy" in bad.output
