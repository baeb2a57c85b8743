"""The latency suite's statistics, rows and summary contract, its plan (the machine in the digest) and how
the run summary and ``codemill compare`` show it (pure functions: no model)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from codemill.evals import latency as lat
from codemill.evals import suites
from codemill.evals.config import EvalConfig
from codemill.evals.suites import latency as suite
from codemill.gate.config import GateConfig
from codemill.report import LOG_WIDTH, comparison_text, metric_lines, summary_lines

MS = lat.NS_PER_MS


def test_percentiles_interpolate_between_order_statistics():
    assert lat.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert lat.percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85)  # rank 0.95 * 3 = 2.85
    assert lat.percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0 and lat.percentile([1, 2, 3, 4], 0) == 1.0
    assert lat.percentile([7.0], 95) == 7.0
    values = list(range(1, 21))  # 1..20: p95 at rank 18.05
    assert lat.percentile(values, 95) == pytest.approx(19.05)
    with pytest.raises(ValueError):
        lat.percentile([], 50)
    with pytest.raises(ValueError):
        lat.percentile([1.0], 101)


def _timed(ttft_ms: float, steps_ms: list[float], prompt: int = 10) -> lat.TimedGeneration:
    return lat.TimedGeneration(prompt, tuple(range(len(steps_ms) + 1)), int(ttft_ms * MS),
                               tuple(int(s * MS) for s in steps_ms))


def test_summary_pools_decode_steps_over_prompts_and_counts_prefill_in_throughput():
    timed = [_timed(10, [1, 2, 3]), _timed(20, [4, 5, 6]), _timed(30, [7, 8, 9])]
    s = lat.summarize(timed)
    assert s["latency_ttft_p50_ms"] == 20 and s["latency_ttft_p95_ms"] == pytest.approx(29)
    assert s["latency_per_token_p50_ms"] == 5 and s["latency_per_token_p95_ms"] == pytest.approx(8.6)
    # 12 tokens in 60 ms of prefill + 45 ms of decode
    assert s["latency_tokens_per_s"] == pytest.approx(12 / 0.105)
    assert s["latency_ttft_p95_ms"] >= s["latency_ttft_p50_ms"]
    assert set(s) == {"latency_ttft_p50_ms", "latency_ttft_p95_ms", "latency_per_token_p50_ms",
                      "latency_per_token_p95_ms", "latency_tokens_per_s"}
    with pytest.raises(ValueError):
        lat.summarize([])


def test_a_timed_generation_has_one_decode_step_per_token_after_the_first():
    with pytest.raises(ValueError, match="need 2 decode steps"):
        lat.TimedGeneration(5, (1, 2, 3), 100, (10,))
    t = _timed(2, [1, 1])
    assert t.total_ns == 4 * MS


def test_rows_pair_by_prompt_and_score_lower_is_better():
    a, b = _timed(10, [1, 3, 2], prompt=12), _timed(5, [2, 2, 2], prompt=7)
    rows = pl.DataFrame([{"item_id": f"r/{i}.py", "cluster": "r", **lat.item_row(t)} for i, t in enumerate((a, b))])
    assert rows["new_tokens"].to_list() == [4, 4] and rows["prompt_tokens"].to_list() == [12, 7]
    assert rows["ttft_ms"].to_list() == [10, 5] and rows["per_token_p50_ms"].to_list() == [2, 2]
    assert rows["per_token_mean_ms"].to_list() == [2, 2] and rows["output_ids"].to_list()[0] == [0, 1, 2, 3]
    scores = suites.item_scores("latency", rows)
    assert set(scores) == {"latency_ttft_ms", "latency_per_token_ms"}
    for s in scores.values():
        assert not s.higher_is_better and not s.binary and s.item_ids.tolist() == ["r/0.py", "r/1.py"]
    assert scores["latency_ttft_ms"].values.tolist() == [10, 5]
    assert suites.SUITE_OF_METRIC["latency_per_token_ms"] == "latency"
    assert all(k.startswith(suites.get("latency").summary_keys) for k in lat.summarize([a, b]))


def test_latency_is_gateable_but_not_gated_by_default():
    assert not {m.name for m in GateConfig().metrics} & {"latency_ttft_ms", "latency_per_token_ms"}


def test_prompts_are_evenly_spaced_and_deterministic():
    assert suite.pick(10, 4) == [0, 2, 5, 7]
    assert suite.pick(3, 8) == [0, 1, 2]
    assert suite.pick(5, 5) == [0, 1, 2, 3, 4]


def test_the_machine_read_without_torch_is_the_one_torch_reports():
    """The plan reads torch's build from its version.py instead of importing it: same identity, same digest."""
    import torch

    cuda = torch.cuda.is_available()
    expected = {"torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
                "device": lat.visible_gpu() if cuda else "cpu"}
    for threads in (1, 3, None):
        found = lat.machine_identity("x", threads)
        assert {k: found[k] for k in expected} == expected
        assert found["threads"] == (threads or torch.get_num_threads())
    assert lat.torch_build()["__version__"] == torch.__version__


def test_planning_latency_with_set_threads_does_not_import_a_cpu_torch():
    import subprocess
    import sys

    build = lat.torch_build()
    if build.get("cuda") is not None or build.get("hip") is not None:
        pytest.skip("a GPU build of torch: whether a GPU is visible is asked of torch")
    code = ("import sys; from codemill.evals.latency import machine_identity; machine_identity('', 1); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_the_digest_holds_the_machine_and_a_label_measures_again(tmp_path):
    from codemill.store import ArtifactStore
    from codemill.tasks.evaluate import plan_suite

    store = ArtifactStore(str(tmp_path))
    model, corpus = store.ref("train", "model", "1" * 64), store.ref("ingest", "corpus", "2" * 64)
    cfg = EvalConfig(suites=["latency"])
    plan = plan_suite("latency", cfg, model, corpus)
    assert plan.config["machine"] == lat.machine_identity() and plan.config["machine"]["cpu"]
    assert plan.digest == plan_suite("latency", EvalConfig(suites=["latency", "bpb"]), model, corpus).digest
    labelled = EvalConfig(suites=["latency"], latency={"label": "host-a"})
    assert plan_suite("latency", labelled, model, corpus).digest != plan.digest
    # the completion items it times come from the completion section: changing them is another measurement
    wider = EvalConfig(suites=["latency"], completion={"context_len": 512})
    assert plan_suite("latency", wider, model, corpus).digest != plan.digest
    # ... but the completion suite's own digest does not see the latency section
    assert (plan_suite("completion", labelled, model, corpus).digest
            == plan_suite("completion", cfg, model, corpus).digest)


SCORES = {"latency_ttft_p50_ms": 3.25, "latency_ttft_p95_ms": 4.5, "latency_per_token_p50_ms": 0.81,
          "latency_per_token_p95_ms": 1.2, "latency_tokens_per_s": 1000.0}


def test_the_run_summary_has_one_latency_line_under_80_columns():
    assert suite.latency_line({"val_bpb": 2.0}) is None
    assert suite.latency_line(SCORES, "cpu") == ("latency p50/p95: TTFT 3.25/4.50 ms, per token 0.81/1.20 ms, "
                                           "1000 tok/s on cpu")
    stage = {"status": "ran", "cost": {"wall_s": 1.0}, "ref": {"name": "latency", "digest": "a" * 64},
             "summary": {"device": "cuda:0 NVIDIA H100 80GB HBM3"}}
    lines = summary_lines({"stages": {"eval:latency": stage}, "scores": {**SCORES, "val_bpb": 2.0}}, 1.0)
    assert all(len(line) <= LOG_WIDTH for line in lines)
    assert not any(line.startswith("latency_") for line in lines)  # not one line per number
    assert sum(line.startswith("latency p50/p95") for line in lines) == 1 and "H100" in "".join(lines)


def test_compare_shows_latency_side_by_side_in_ms():
    metric = {"metric": "latency_ttft_ms", "candidate": 3.0, "champion": 4.0, "diff": 1.0, "ci_low": 0.5,
              "ci_high": 1.5, "se": 0.2, "se_item": 0.2, "p_regression": 1.0, "p_regression_holm": 1.0,
              "p_improvement": 0.001, "p_improvement_holm": 0.002, "n_items": 8, "n_clusters": 4}
    lines = metric_lines(metric, "a", "b")
    assert "lower is faster" in lines[0] and "a 3.0000 ms   b 4.0000 ms   diff +1.0000 ms" in lines[1]
    assert "ms" not in metric_lines({**metric, "metric": "val_bpb"}, "a", "b")[1]
    result = {"model_a": "m-a", "model_b": "m-b", "alpha": 0.05, "verdict": "promote", "reason": "faster",
              "calibrated": False, "metrics": [metric],
              "latency": {"a": SCORES, "b": {**SCORES, "latency_ttft_p50_ms": 6.5}, "prompts": 8, "new_tokens": 16,
                          "on": {"device": "cpu", "dtype": "float32", "engine": "transformers",
                                 "engine_version": "5.25.0", "threads": 2}}}
    text = comparison_text(result)
    assert all(len(line) <= LOG_WIDTH for line in text.splitlines())
    (ttft,) = [line for line in text.splitlines() if line.strip().startswith("TTFT p50")]
    assert ttft.split()[-3:] == ["3.250", "6.500", "0.50"]
    assert "tokens/s" in text and "same machine: cpu float32" in text


def test_a_missing_decode_step_leaves_the_per_token_numbers_out():
    row = lat.item_row(lat.TimedGeneration(3, (5,), 100, ()))
    assert math.isnan(row["per_token_mean_ms"]) and row["new_tokens"] == 1
    assert "latency_per_token_p50_ms" not in lat.summarize([lat.TimedGeneration(3, (5,), 100, ())])
    assert np.isfinite(lat.summarize([_timed(1, [1])])["latency_per_token_p95_ms"])


def test_compare_reads_both_summaries_and_the_machine_from_the_paired_manifests():
    from codemill.store import Manifest

    def manifest(ttft: float) -> Manifest:
        return Manifest(stage="evaluate", name="latency", digest="d" * 64, uri="u", code_version="v",
                        config={"machine": {"cpu": "x"}},
                        stats={**SCORES, "latency_ttft_p50_ms": ttft, "device": "cpu", "dtype": "float32",
                               "engine": "transformers", "engine_version": "5", "threads": 1, "prompts": 8,
                               "new_tokens": 16})

    side = suite.latency_side_by_side(manifest(2.0), manifest(4.0))
    assert side["a"]["latency_ttft_p50_ms"] == 2.0 and side["b"]["latency_ttft_p50_ms"] == 4.0
    assert side["on"]["device"] == "cpu" and side["prompts"] == 8 and side["new_tokens"] == 16
