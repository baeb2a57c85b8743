"""Every summary and table codemill prints fits the terminal: at 80 and at 120 columns no line is longer than
the width, no row is split across lines or cut to an ellipsis, and tiny metric values keep their digits.

The run summary is built the way the flows build it (StageResults with store references, ``scores_of``, the
gate's own verdict) from realistic values: a long store root, full digests, all suites."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from codemill import cli
from codemill.evals.stats import ItemScores
from codemill.flows.common import scores_of
from codemill.gate.evidence import GateMetric, collect
from codemill.gate.policy import decide
from codemill.layout import num, signed
from codemill.store import ArtifactStore
from codemill.tasks.common import StageResult

WIDTHS = (80, 120)
ELLIPSIS = "\u2026"
TINY = 0.000123  # four decimals would print it as 0.0000


def assert_fits(text: str, width: int) -> list[str]:
    lines = text.splitlines()
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, f"lines over {width} columns:\n" + "\n".join(too_long)
    assert ELLIPSIS not in text, text
    return lines


def one_line(lines: list[str], *parts: str) -> str:
    """The single line holding every part: a row split across lines or cut matches none."""
    found = [line for line in lines if all(p in line for p in parts)]
    assert len(found) == 1, (parts, "\n".join(lines))
    return found[0]


@pytest.fixture
def store(tmp_path_factory: pytest.TempPathFactory) -> ArtifactStore:
    """A store root as long as a shared one usually is (about 60 characters)."""
    return ArtifactStore(str(tmp_path_factory.mktemp("s") / "srv" / "code-models" / "artifact-store"))


def _digest(seed: int) -> str:
    return bytes(np.random.default_rng(seed).integers(0, 256, 32, dtype=np.uint8)).hex()


def _stage(store: ArtifactStore, stage: str, name: str, seed: int, summary: dict | None = None,
           status: str = "ran") -> StageResult:
    cost = {"wall_s": 157.04 + seed, "cpu_s": 1120.7, "gpu_s": 0.0} if status == "ran" else {}
    return StageResult(ref=store.ref(stage, name, _digest(seed)), status=status, run_id=_digest(seed)[:32],
                       summary=summary or {}, cost=cost)


def _with_ci(name: str, value: float, half: float) -> dict[str, float]:
    return {name: value, f"{name}_ci_low": max(0.0, value - half), f"{name}_ci_high": value + half}


def _stages(store: ArtifactStore) -> dict[str, StageResult]:
    infilling = {}
    for kind in ("", "single_line_", "multi_line_", "random_span_"):
        infilling |= _with_ci(f"humaneval_infilling_{kind}pass_at_1", TINY, TINY)
        infilling |= _with_ci(f"humaneval_infilling_{kind}exact_match", 0.0, 0.0)
    return {
        "ingest": _stage(store, "ingest", "corpus", 1, status="present"),
        "tokenizer": _stage(store, "tokenizer", "tokenizer", 2, status="cached"),
        "tokenize": _stage(store, "tokenize", "tokens", 3),
        "train": _stage(store, "train", "model", 4),
        "augment": _stage(store, "augment", "humaneval-plus", 5),
        "eval:bpb": _stage(store, "evaluate", "bpb", 6, {"suite": "bpb", **_with_ci("val_bpb", 2.5375, 0.12)}),
        "eval:completion": _stage(store, "evaluate", "completion", 7, {
            "suite": "completion", **_with_ci("completion_exact_match", 0.0, 0.0),
            **_with_ci("completion_edit_similarity", 0.0636, 0.01)}),
        "eval:humaneval": _stage(store, "evaluate", "humaneval", 8, {
            "suite": "humaneval", **_with_ci("humaneval_pass_at_1", 0.0061, 0.004),
            **_with_ci("humaneval_plus_pass_at_1", 0.0, 0.0), "plus_only_failures": 0.0}),
        "eval:humaneval_infilling": _stage(store, "evaluate", "humaneval_infilling", 9,
                                          {"suite": "humaneval_infilling", **infilling}),
        "eval:latency": _stage(store, "evaluate", "latency", 10, {
            "suite": "latency", "latency_ttft_p50_ms": 8.93, "latency_ttft_p95_ms": 9.25,
            "latency_per_token_p50_ms": 1.58, "latency_per_token_p95_ms": 2.17, "latency_tokens_per_s": 489.2,
            "device": "cuda:0 NVIDIA H100 80GB HBM3"}),
    }


def _verdict(champion_version: str = "12") -> dict:
    """The gate's own verdict on four metrics of two models, as the gate task returns it."""
    rng = np.random.default_rng(0)
    n = 164
    ids, clusters = np.array([f"HumanEval/{i}" for i in range(n)]), np.arange(n)
    cand, champ = {}, {}
    for name, base, binary in (("val_bpb", 2.5, False), ("completion_edit_similarity", 0.06, False),
                               ("humaneval_pass_at_1", 0.01, True), ("humaneval_infilling_pass_at_1", 0.001, True)):
        a = (rng.random(n) < base).astype(float) if binary else base + 0.01 * rng.normal(size=n)
        b = (rng.random(n) < base).astype(float) if binary else base + 0.01 * rng.normal(size=n)
        higher = name != "val_bpb"
        cand[name] = ItemScores(ids, a, np.ones(n), clusters, higher, binary=binary)
        champ[name] = ItemScores(ids, b, np.ones(n), clusters, higher, binary=binary)
    v = decide(collect([cand], champ, [GateMetric(m) for m in cand])).as_dict()
    return v | {"registered_model": "codemill-python-small-experiment", "alias": "champion",
                "champion_version": champion_version, "calibrate_advice": "codemill calibrate --seeds 10"}


@pytest.fixture
def run_out(store: ArtifactStore) -> dict:
    """What the pipeline flow returns (``flows.common.flow_result``'s shape), from StageResults."""
    stages = _stages(store)
    return {"parent_run_id": "b76deb1b20ef424c81bc6eac542273a8", "experiment_id": "1",
            "tracking_uri": f"sqlite:///{store.root}/../mlflow.db",
            "flow_run_id": "63c9ce09-cadf-4a33-b754-4f947cb133a2", "model_id": "m-c2b93154efc8471c9a63a2db2d5baada",
            "scores": scores_of(stages), "gate": _verdict(),
            "stages": {k: v.model_dump(mode="json") for k, v in stages.items()}}


def _printed(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], width: int, show) -> str:
    """What the CLI prints at a terminal of ``width`` columns (rich reads COLUMNS)."""
    monkeypatch.setenv("COLUMNS", str(width))
    capsys.readouterr()
    show()
    return capsys.readouterr().out


@pytest.mark.parametrize("width", WIDTHS)
def test_the_run_summary_fits_with_one_row_per_stage_and_one_line_per_suite(
        run_out: dict, store: ArtifactStore, width: int, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = assert_fits(_printed(monkeypatch, capsys, width, lambda: cli.print_summary(run_out, 340.1)), width)
    assert one_line(lines, f"store: {store.root}")  # printed once; the rows are relative to it
    for key, st in run_out["stages"].items():
        ref = st["ref"]
        artifact = f"{ref['stage']}/{ref['name']}-{ref['digest'][:12]}" if width >= 120 else ref["digest"][:12]
        row = one_line(lines, f"{key} ", artifact)
        assert row.startswith(f"{key} ") and row.split()[1] in ("ran", "cached", "in", "store")
    for metric, value, ci in (("val_bpb", "2.5375", "2.4175 - 2.6575"),
                              ("completion_edit_similarity", "0.0636", "0.0536 - 0.0736"),
                              ("humaneval_pass_at_1", "0.0061", "0.0021 - 0.0101"),
                              ("humaneval_infilling_pass_at_1", "0.000123", "0 - 0.000246")):  # not 0.0000
        one_line(lines, f"{metric} ", f" {value} ", ci)
    one_line(lines, "latency p50/p95", "TTFT 8.93/9.25 ms")
    for m in run_out["gate"]["metrics"]:  # the gate table: metric, difference, CI, p worse, p better
        row = [line.split() for line in lines if line.split()[:2] == [m["metric"], signed(m["diff"])]]
        assert len(row) == 1 and row[0][-2:] == [f"{m['p_regression_holm']:.3g}", f"{m['p_improvement_holm']:.3g}"]
    assert not any(line.startswith("humaneval_infilling_random_span") for line in lines)  # --verbose has those


@pytest.mark.parametrize("width", WIDTHS)
def test_verbose_adds_every_score_and_each_gate_metric_in_full(
        run_out: dict, width: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    lines = assert_fits(_printed(monkeypatch, capsys, width, lambda: cli.print_summary(run_out, 1.0, True)), width)
    scores = run_out["scores"]
    for key in scores:
        if "_ci_" not in key and not key.startswith("latency_"):  # the score table: metric, value, CI
            assert sum(line.split()[:2] == [key, num(scores[key])] for line in lines) == 1, key
    assert sum(line.strip().startswith("MDE (80% power)") for line in lines) == len(run_out["gate"]["metrics"])


@pytest.mark.parametrize("width", WIDTHS)
def test_progress_rows_keep_stage_count_and_time_whole(store: ArtifactStore, width: int) -> None:
    from codemill.progress_view import RichSink, progress_display

    console = Console(width=width, record=True, file=io.StringIO(), force_terminal=False)
    bar = progress_display(console)
    sink = RichSink(bar, store.root_uri)
    stages = _stages(store)
    for name in ("ingest", "tokenizer", "tokenize", "train", "augment"):  # flows.common: status and artifact
        sink.stage(name, f"{stages[name].status}: {stages[name].ref.uri}")
    sink.update("tokenize", 632, 632)
    sink.update("train", 150, 150)
    sink.stage("evaluate", f"humaneval_infilling: {stages['train'].ref.uri}")  # tasks.evaluate
    sink.stage("rollouts", "policy-3f2a9c1d7b4e: batch 12/16")  # tasks.rl
    sink.stage("policy", "update workers x8")
    sink.stage("repo_tasks", "bundling the snapshots of 128 tasks")
    console.print(bar.get_renderable())
    lines = assert_fits(console.export_text(), width)
    assert len(lines) == len(sink.rows)  # one line per row: nothing folded onto a second
    for name, line in zip(sink.rows, lines, strict=True):
        assert name in line.split()[:2], line  # after the spinner (blank once a row is done)
    one_line(lines, "train ", "150/150", "ran: train/model-")
    one_line(lines, "evaluate ", "humaneval_infilling: train/model-")


def test_the_other_libraries_progress_bars_are_off_here_and_in_child_processes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as hf_logging

    from codemill.progress_view import silence_library_bars

    for key in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):  # unset (tests/conftest.py sets TQDM_DISABLE)
        monkeypatch.setenv(key, "")  # and restored after the test
        monkeypatch.delenv(key)
    was_on = hf_logging.is_progress_bar_enabled()
    try:
        silence_library_bars()
        assert not hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
        child = subprocess.run(
            [sys.executable, "-c", "import transformers.utils.logging as l, tqdm\n"
             "print(l.is_progress_bar_enabled(), tqdm.tqdm(range(3)).disable)"],
            capture_output=True, text=True, check=True, env=dict(os.environ))
        assert child.stdout.split() == ["False", "True"], child
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
            enable_progress_bars()


def _rl_out() -> dict:
    rows = [{"iteration": i, "reward_mean": 0.125 * i, "pass_rate": 0.1 * i, "signal_groups": 0.25,
             "kl": 1.2e-05 * (i + 1), "response_tokens_mean": 181.3, "turns_mean": 2.5, "observed_token_frac": 0.42,
             "rollout_wall_s": 1234.5, "update_s": 512.25} for i in range(3)]
    heldout = {"before": {"rate": 0.25}, "after": {"rate": 0.3125}, "gain": 0.0625, "gain_ci_low": -0.0125,
               "gain_ci_high": 0.1375, "p_value": 0.0412, "problems": 164}
    return {"iterations": rows, "heldout": heldout, "gate": {"verdict": "hold"},
            "model_id": "m-c2b93154efc8471c9a63a2db2d5baada", "parent_run_id": "b76deb1b20ef424c81bc6eac542273a8"}


@pytest.mark.parametrize("width", WIDTHS)
def test_the_rl_summary_fits_and_shows_a_tiny_kl(width: int, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    lines = assert_fits(_printed(monkeypatch, capsys, width, lambda: cli.print_rl_summary(_rl_out(), 5432.1)), width)
    rows = [line.split() for line in lines if line[:4].strip() in ("0", "1", "2")]
    assert [r[4] for r in rows] == ["1.2e-05", "2.4e-05", "3.6e-05"]


@pytest.mark.parametrize("width", WIDTHS)
def test_problem_counts_split_into_tables_that_fit(store: ArtifactStore, width: int,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from codemill.report import PROBLEM_COUNTS

    names = ("humaneval-format-internal-problems", "mined-doctests-from-corpus", "synthetic-arithmetic")
    by_source = {n: {c: 1000 + i for i, c in enumerate(PROBLEM_COUNTS)} for n in names}
    by_source[names[1]]["mining"] = {"functions": 5120, "with_doctests": 812, "runnable": 640, "kept": 512}
    result = {"summary": {"by_source": by_source, "totals": {c: 3000 + i for i, c in enumerate(PROBLEM_COUNTS)}},
              "status": "ran", "ref": store.ref("problems", "problems", _digest(20)).model_dump(mode="json"),
              "run_id": _digest(21)[:32]}
    out = _printed(monkeypatch, capsys, width, lambda: cli.print_problem_counts(result, 61.6))
    lines = assert_fits(out, width)
    for name in (*names, "total"):
        assert name in out
    for count in PROBLEM_COUNTS:  # one row per count in each part, none folded
        rows = [line for line in lines if line.split()[:1] == [count]]
        assert rows and all(len(r.split()) >= 2 for r in rows), count


@pytest.mark.parametrize("width", WIDTHS)
def test_the_calibration_table_names_each_metric_whole(store: ArtifactStore, width: int) -> None:
    from codemill.report import calibration_lines

    stages = {f"seed{i}:{s}": _stage(store, "evaluate" if s != "train" else "train", s, 30 + 7 * i + j)
              for i in range(3) for j, s in enumerate(("train", "humaneval_infilling"))}
    metrics = [{"metric": m, "n_seeds": 3, "mean": 0.1, "seed_sd": sd, "item_se": 0.0123, "se_total": 0.0234,
                "mde_better": 0.0456, "mde_worse": 0.0567}
               for m, sd in (("val_bpb", 0.0123), ("humaneval_infilling_pass_at_1", TINY),
                             ("completion_edit_similarity", 0.0021))]
    out = {"recipe_key": _digest(40), "seeds": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
           "calibration": store.ref("calibration", "noise", _digest(41)).uri, "alpha": 0.05, "metrics": metrics,
           "stages": {k: v.model_dump(mode="json") for k, v in stages.items()},
           "registered_model": "codemill-python-small-experiment", "parent_run_id": _digest(42)[:32]}
    lines = assert_fits("\n".join(calibration_lines(out, 4321.0, width)), width)
    one_line(lines, "humaneval_infilling_pass_at_1 ", "0.000123")
    for key in stages:
        one_line(lines, f"{key} ")


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_fits(width: int) -> None:
    from codemill.compare import render_comparison

    result = {"model_a": "m-" + "a" * 32, "model_b": "m-" + "b" * 32, **_verdict(),
              "calibration": "/srv/experiments/code-models/shared-artifact-store/calibration/noise-0a1b2c3d4e5f"}
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(render_comparison(result, width))
    assert_fits(console.export_text(), width)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_lineage_tree_fits_with_store_paths_and_digests_short(store: ArtifactStore, width: int) -> None:
    from codemill.lineage.view import node, render

    stages = _stages(store)

    def artifact(role: str, key: str, children: list) -> dict:
        r = stages[key].ref
        return node(role, f"{role} {r.stage}:{r.name}-{r.digest[:12]}",
                    {"stage": r.stage, "name": r.name, "digest": r.digest, "uri": r.uri,
                     "code_version": f"{r.stage}-v3", "run_id": stages[key].run_id}, children)

    source = node("source", "/home/researcher/src/python-projects-2026",
                  {"root": "/home/researcher/src/python-projects-2026", "kind": "local", "fingerprint": _digest(50)})
    corpus = artifact("corpus", "ingest", [source])
    tree = node("model", "model m-c2b93154efc8471c9a63a2db2d5baada (codemill-python-small-experiment)",
                {"model_id": "m-c2b93154efc8471c9a63a2db2d5baada", "digest": stages["train"].ref.digest,
                 "uri": stages["train"].ref.uri, "experiment_id": "1", "registered": ["codemill@champion v12"]},
                [node("evals", "eval scores", {}, [
                    node("metric", "", {"key": k, "value": v, "ci_low": v, "ci_high": 2 * v, "step": 150,
                                        "dataset_name": "corpus-val", "dataset_digest": "6c3f1e0b",
                                        "run_id": _digest(60)[:32]})
                    for k, v in sorted(scores_of(stages).items()) if "_ci_" not in k]),
                 artifact("checkpoint", "train", [
                     node("training_run", f"training run {_digest(61)[:32]}", {"run_id": _digest(61)[:32]}, [
                         artifact("tokens", "tokenize", [corpus, artifact("tokenizer", "tokenizer", [])])])])])
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(render(tree, width, store.root_uri))
    lines = assert_fits(console.export_text(), width)
    one_line(lines, f"store: {store.root}")
    one_line(lines, f"uri: ingest/corpus-{stages['ingest'].ref.digest[:12]}")
    one_line(lines, f"run {_digest(60)[:32]} on corpus-val@6c3f1e0b")
    one_line(lines, "humaneval_infilling_random_span_pass_at_1 ", " 0.000123 ", "0.000123 - 0.000246")


@pytest.mark.parametrize("width", WIDTHS)
def test_a_trajectory_headers_fit(width: int) -> None:
    from codemill.rl.trajectory import render_row

    row = {"problem_id": "mined/python-projects-2026/src/parsers/tokenizer.py::test_split_words", "group": 12,
           "sample": 3, "turns": 2, "prompt_ids": list(range(300)), "completion_ids": list(range(40)),
           "loss_mask": [1] * 20 + [0] * 10 + [1] * 10, "logprobs": [-0.5] * 40, "turn_starts": [0, 30],
           "turn_finish_reasons": ["stop", "length"], "finish_reason": "length", "outcome": "failed",
           "reward": 0.0, "turn_rewards": [0.0, 0.0], "suspicious": "",
           "env_stats": '{"tests_run": 12, "tests_failed": 3, "wall_s": 1.25, "sandbox_exit": 1, "timeouts": 0}'}
    assert_fits(render_row(row, lambda ids: f"token block of {len(ids)}", 2000, width), width)


@pytest.mark.parametrize("width", WIDTHS)
def test_plan_fits_from_the_real_command(tmp_path: Path, store: ArtifactStore, width: int) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "module.py").write_text("def f(x):\n    return x + 1\n")
    res = CliRunner().invoke(cli.app, ["plan", "--source", str(src), "--store", store.root_url],
                             env={"COLUMNS": str(width)})
    assert res.exit_code == 0, res.output
    lines = assert_fits(res.output, width)
    for step in ("ingest", "tokenizer", "tokenize", "train", "eval:bpb", "eval:humaneval_infilling"):
        row = one_line(lines, f"{step} ", "run")
        assert row.startswith(f"{step} ")
    one_line(lines, f"store: {store.root}")
