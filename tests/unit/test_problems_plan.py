"""The problems stage's plan: what is hashed (config, file fingerprints, the corpus when mining), what is not
(runtime-only fields), and `codemill problems` refusing a missing file in one line before anything runs."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from codemill.cli import app
from codemill.config import load_preset
from codemill.plan import external_input
from codemill.problems.config import ProblemsConfig, ProblemSourceConfig
from codemill.tasks.problems import plan_problems

FILE_FP = [{"name": "p.jsonl", "kind": "jsonl", "root": "/x/p.jsonl", "fingerprint": "a" * 64, "files": 1}]


def test_the_digest_follows_config_and_inputs_but_not_runtime_fields():
    cfg = ProblemsConfig(sources=[ProblemSourceConfig(kind="jsonl", path="/x/p.jsonl"), ProblemSourceConfig()])
    base = plan_problems(cfg, FILE_FP, None)
    assert list(base.inputs) == ["source.0.p.jsonl"] and base.stage == "problems"
    runtime = cfg.model_copy(deep=True)
    runtime.workers = 7
    runtime.sources[0].storage_options = {"endpoint_url": "http://elsewhere"}
    assert plan_problems(runtime, FILE_FP, None).digest == base.digest
    seeded = cfg.model_copy(deep=True)
    seeded.sources[1].seed = 1
    assert plan_problems(seeded, FILE_FP, None).digest != base.digest
    changed = [{**FILE_FP[0], "fingerprint": "b" * 64}]
    assert plan_problems(cfg, changed, None).digest != base.digest


def test_a_mined_source_makes_the_corpus_an_input():
    cfg = ProblemsConfig(sources=[ProblemSourceConfig(kind="mined")])
    with pytest.raises(ValueError, match="needs the corpus"):
        plan_problems(cfg, [], None)
    a = plan_problems(cfg, [], external_input("ingest", "corpus", "c" * 64, "/store/ingest/corpus-ccc"))
    b = plan_problems(cfg, [], external_input("ingest", "corpus", "d" * 64, "/store/ingest/corpus-ddd"))
    assert a.input_digests == {"corpus": "c" * 64} and a.digest != b.digest


def test_the_tiny_preset_has_the_synthetic_steps_source():
    (src,) = load_preset("tiny").problems.sources
    assert (src.kind, src.family, src.count) == ("synthetic", "steps", 400)


def test_codemill_problems_refuses_a_missing_file_in_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"problems:\n  sources:\n    - kind: jsonl\n      path: {tmp_path}/nope.jsonl\n")
    result = CliRunner().invoke(app, ["problems", "--config", str(cfg), "--store", str(tmp_path / "store")])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and "nope.jsonl" in line and "does not exist" in line
    assert not (tmp_path / "store").exists()
