"""`codemill lineage` and `codemill compare` on a real two-model pipeline run (real Prefect, MLflow, store)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from codemill.cli import app
from codemill.layout import signed
from codemill.lineage import mlflow_digest

pytestmark = pytest.mark.integration
WIDE = {"COLUMNS": "300", "NO_COLOR": "1"}


def _cli(runs: dict[str, Any], *args: str, env: dict[str, str] = WIDE):
    cfg = runs["cfg"]
    return CliRunner().invoke(app, [*args, "--store", cfg.store_root, "--tracking-uri", cfg.mlflow_tracking_uri],
                              env=env)


def _json(runs: dict[str, Any], *args: str) -> dict:
    res = _cli(runs, *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _nodes(tree: dict, kind: str) -> list[dict]:
    found = [tree] if tree["kind"] == kind else []
    for child in tree["children"]:
        found += _nodes(child, kind)
    return found


def _digest(run: dict, stage: str) -> str:
    return run["stages"][stage]["ref"]["digest"]


def _assert_full_chain(tree: dict, runs: dict[str, Any], run: dict) -> None:
    cfg = runs["cfg"]
    assert tree["kind"] == "model" and tree["attrs"]["model_id"] == run["model_id"]
    assert tree["attrs"]["digest"] == _digest(run, "train")
    (bpb,) = [m["attrs"] for m in _nodes(tree, "metric") if m["attrs"]["key"] == "val_bpb"]
    assert bpb["value"] == pytest.approx(run["scores"]["val_bpb"])
    assert bpb["dataset_digest"] == mlflow_digest(_digest(run, "ingest")) and bpb["dataset_name"] == "corpus-val"
    assert bpb["run_id"] == run["stages"]["eval:bpb"]["run_id"]
    (ckpt,) = _nodes(tree, "checkpoint")
    assert ckpt["attrs"]["digest"] == _digest(run, "train")
    assert ckpt["attrs"]["run_id"] == run["stages"]["train"]["run_id"]
    (train,) = ckpt["children"]
    assert train["kind"] == "training_run" and train["attrs"]["run_id"] == run["stages"]["train"]["run_id"]
    assert sorted(c["kind"] for c in train["children"]) == ["tokenizer", "tokens"]  # the trainer's two inputs
    (tokens,) = [c for c in train["children"] if c["kind"] == "tokens"]
    assert tokens["kind"] == "tokens" and tokens["attrs"]["digest"] == _digest(run, "tokenize")
    assert tokens["attrs"]["run_id"] == run["stages"]["tokenize"]["run_id"]
    corpus = [n for n in _nodes(tree, "corpus") if n["children"]]
    assert len(corpus) == 1 and corpus[0]["attrs"]["digest"] == _digest(run, "ingest")
    assert corpus[0]["attrs"]["uri"] == run["stages"]["ingest"]["ref"]["uri"]
    (source,) = corpus[0]["children"]
    assert source["kind"] == "source" and source["attrs"]["root"] == cfg.ingest.sources[0].path
    assert len(source["attrs"]["fingerprint"]) == 64
    tokenizers = _nodes(tree, "tokenizer")  # an input of train and of tokenize: expanded once, then referenced
    assert [n["title"].endswith("(shown above)") for n in tokenizers].count(False) == 1
    assert {n["attrs"]["digest"] for n in tokenizers} == {_digest(run, "tokenizer")}


def test_lineage_of_a_model_id_walks_to_the_sources(lineage_runs):
    first = lineage_runs["first"]
    tree = _json(lineage_runs, "lineage", first["model_id"])
    _assert_full_chain(tree, lineage_runs, first)
    assert tree["attrs"]["registered"] == []  # the second model, better on val_bpb, took the alias
    second = _json(lineage_runs, "lineage", lineage_runs["second"]["model_id"])
    assert lineage_runs["second"]["gate"]["verdict"] == "promote"
    assert second["attrs"]["registered"] == [f"{lineage_runs['cfg'].name}@champion "
                                             f"v{lineage_runs['second']['gate']['champion_version']}"]


@pytest.mark.parametrize("kind", ["parent_run", "train_run", "eval_run", "train_digest_prefix", "eval_digest"])
def test_lineage_of_runs_and_digests_reaches_the_same_model(lineage_runs, kind):
    run = lineage_runs["second"]
    ident = {"parent_run": run["parent_run_id"], "train_run": run["stages"]["train"]["run_id"],
             "eval_run": run["stages"]["eval:completion"]["run_id"],
             "train_digest_prefix": _digest(run, "train")[:10],
             "eval_digest": _digest(run, "eval:bpb")}[kind]
    _assert_full_chain(_json(lineage_runs, "lineage", ident), lineage_runs, run)


def test_lineage_of_an_upstream_artifact_starts_there(lineage_runs):
    first = lineage_runs["first"]
    tree = _json(lineage_runs, "lineage", _digest(first, "tokenize"))
    assert tree["kind"] == "tokenize" and tree["attrs"]["digest"] == _digest(first, "tokenize")
    assert [c["kind"] for c in tree["children"]] == ["corpus", "tokenizer"]
    (source,) = _nodes(tree, "source")
    assert source["attrs"]["root"] == lineage_runs["cfg"].ingest.sources[0].path


def test_lineage_tree_text_shows_each_link(lineage_runs):
    first = lineage_runs["first"]
    res = _cli(lineage_runs, "lineage", first["model_id"])
    assert res.exit_code == 0, res.output
    for text in (first["model_id"], _digest(first, "train")[:12], first["stages"]["train"]["run_id"],
                 _digest(first, "tokenize")[:12], _digest(first, "ingest")[:12],
                 lineage_runs["cfg"].ingest.sources[0].path, "val_bpb ", "training run"):
        assert text in res.output, text  # digests as the store's folder names carry them


@pytest.mark.parametrize("ident,message", [("m-0123456789abcdef", "no LoggedModel"),
                                           ("0123456789abcdef0123456789abcdef", "no artifact with digest"),
                                           ("deadbeefcafe", "no artifact with digest"),
                                           ("not-an-id", "is not a model id")])
def test_lineage_of_an_unknown_id_fails_clearly(lineage_runs, ident, message):
    res = _cli(lineage_runs, "lineage", ident)
    assert res.exit_code == 2, (res.exit_code, res.output)  # the README promises 2 for an id that names nothing
    assert message in res.output and repr(ident) in res.output, res.output  # says what was not found


def test_compare_matches_the_gate_of_the_second_run(lineage_runs):
    first, second = lineage_runs["first"], lineage_runs["second"]
    assert first["model_id"] != second["model_id"]
    result = _json(lineage_runs, "compare", second["model_id"], first["model_id"])
    got = {m["metric"]: m for m in result["metrics"]}
    assert set(got) == {"val_bpb", "completion_exact_match", "completion_edit_similarity"}
    assert got["val_bpb"]["candidate"] == pytest.approx(second["scores"]["val_bpb"])
    assert got["val_bpb"]["champion"] == pytest.approx(first["scores"]["val_bpb"])
    # bpb: lower is better, so diff (+ = a better) = b - a
    assert got["val_bpb"]["diff"] == pytest.approx(first["scores"]["val_bpb"] - second["scores"]["val_bpb"])
    gated = {m["metric"]: m for m in second["gate"]["metrics"]}  # the gate compared the same two models
    assert gated, second["gate"]
    for name, ev in gated.items():
        for key in ("candidate", "champion", "diff", "se", "ci_low", "ci_high", "n_items", "n_clusters",
                    "p_improvement"):
            assert got[name][key] == pytest.approx(ev[key]), (name, key)
    assert result["evaluations"]["bpb"]["data"] == _digest(first, "ingest")


def test_compare_table_and_reverse(lineage_runs):
    first, second = lineage_runs["first"], lineage_runs["second"]
    res = _cli(lineage_runs, "compare", first["model_id"], second["model_id"], env={**WIDE, "COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    forward = _json(lineage_runs, "compare", second["model_id"], first["model_id"])
    lines = res.output.splitlines()
    assert max(map(len, lines)) <= 80, res.output  # readable in an 80-column log, nothing cut to "comp…"
    assert "…" not in res.output and "uncalibrated" in res.output
    for m in forward["metrics"]:
        start = next(i for i, ln in enumerate(lines) if ln.startswith(m["metric"] + " (+ = a better)"))
        block = "\n".join(lines[start:start + 6])
        assert f"diff {signed(-m['diff'] + 0.0)}" in block and f"items {m['n_items']}," in block, block
    bad = _cli(lineage_runs, "compare", first["model_id"], "m-0123456789abcdef")
    assert bad.exit_code == 2, (bad.exit_code, bad.output)
    assert "no LoggedModel 'm-0123456789abcdef'" in bad.output, bad.output
