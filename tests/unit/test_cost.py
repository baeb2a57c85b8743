"""Stage cost: measured CPU-seconds and GPU-seconds, one cost line per stage at the end of the run report, and
the run summary readable in an 80-column log."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from codemill.cost import StageCost, cost_line, measure
from codemill.report import eval_report_markdown, summary_lines


def test_measure_counts_children_cpu_and_gpu_seconds():
    with measure(gpus=2) as spent:
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                        "while time.process_time() - t < 0.3: pass"], check=True)
        time.sleep(0.05)
    assert spent.cpu_s >= 0.25  # the child's CPU time counts once it has been waited for
    assert spent.wall_s >= spent.cpu_s * 0.9 and spent.gpu_s == pytest.approx(2 * spent.wall_s)
    assert StageCost(1.0, 2.0, 0.0).metrics() == {"cost_wall_s": 1.0, "cost_cpu_s": 2.0, "cost_gpu_s": 0.0}


def test_run_report_ends_with_a_cost_line_per_stage():
    costs = {"ingest": ("present", {}), "train": ("ran", {"wall_s": 41.24, "cpu_s": 80.31, "gpu_s": 0.0}),
             "eval:bpb": ("ran", {"wall_s": 3.0, "cpu_s": 5.5, "gpu_s": 0.0})}
    md = eval_report_markdown("run", {}, None, {}, costs)
    tail = md.split("## Cost per stage")[1].strip().splitlines()
    assert tail[1] == cost_line("ingest", "present", {}) and "skipped" in tail[1]
    assert tail[2] == "train              ran      wall    41.2 s  CPU    80.3 s  GPU    0.0 s"
    assert tail[-2].startswith("total") and "wall    44.2 s  CPU    85.8 s" in tail[-2]
    assert md.rstrip().endswith("```")


def test_run_summary_fits_80_columns():
    stage = {"ref": {"stage": "evaluate", "name": "completion", "digest": "ab" * 32,
                     "uri": "/a/very/long/store/path/" + "x" * 80}, "status": "ran",
             "cost": {"wall_s": 12.3, "cpu_s": 20.0, "gpu_s": 0.0}}
    metric = {"metric": "completion_edit_similarity", "candidate": 0.1234, "champion": 0.1111, "diff": 0.0123,
              "ci_low": -0.0123, "ci_high": 0.0369, "se": 0.0125, "se_item": 0.01, "seed_sd": 0.0053, "n_seeds": 5,
              "df": 12.3, "calibrated": True, "p_regression": 0.9, "p_regression_holm": 1.0, "p_improvement": 0.16,
              "p_improvement_holm": 0.32, "mde": 0.0456, "mde_worse": 0.0567, "n_items": 150, "n_clusters": 40}
    out = {"stages": {"eval:completion": stage, "tokenizer": {**stage, "status": "cached"}},
           "scores": {"val_bpb": 2.5, "val_bpb_ci_low": 2.4, "val_bpb_ci_high": 2.6},
           "gate": {"verdict": "hold", "reason": "no significant difference from the champion" * 3,
                    "registered_model": "codemill-tiny", "alias": "champion", "champion_version": "3",
                    "metrics": [metric]}}
    lines = summary_lines(out, 12.0)
    assert max(map(len, lines)) <= 80, "\n".join(lines)
    (row,) = [line.split() for line in lines if line.startswith("eval:completion ")]
    assert row[1:4] == ["ran", "12.3", "20.0"] and row[-1] == "completion-abababababab"
    assert "seed SD" not in "\n".join(lines)  # each gate metric's noise in full is --verbose's
    verbose = summary_lines(out, 12.0, verbose=True)
    assert max(map(len, verbose)) <= 80, "\n".join(verbose)
    text = "\n".join(verbose)
    assert "seed SD 0.0053 (5 seeds)" in text and "MDE (80% power) better 0.0456" in text


def test_an_uncalibrated_summary_says_what_to_run_and_how_long_it_takes():
    def stage(status: str, wall: float) -> dict:
        return {"ref": {"stage": "s", "name": "n", "digest": "ab" * 32, "uri": "/s"}, "status": status,
                "cost": {"wall_s": wall, "cpu_s": wall, "gpu_s": 0.0}}

    metric = {"metric": "val_bpb", "candidate": 2.4, "champion": 2.5, "diff": 0.1, "ci_low": 0.05, "ci_high": 0.15,
              "se": 0.01, "se_item": 0.01, "seed_sd": 0.0, "n_seeds": 0, "calibrated": False, "hold_margin": 0.45,
              "p_regression": 1.0, "p_regression_holm": 1.0, "p_improvement": 0.0, "p_improvement_holm": 0.0,
              "n_items": 80, "n_clusters": 20}
    gate = {"verdict": "hold", "reason": "uncalibrated", "registered_model": "m", "alias": "champion",
            "champion_version": "1", "metrics": [metric], "calibrated": False,
            "calibrate_advice": "codemill calibrate --seeds 10 --from-champion"}
    out = {"stages": {"train": stage("ran", 70.0), "eval:bpb": stage("ran", 20.0)}, "scores": {}, "gate": gate}
    lines = summary_lines(out, 90.0)
    verbose = summary_lines(out, 90.0, verbose=True)
    text = " ".join(" ".join(verbose).split())  # wrapped lines joined back
    assert max(map(len, lines + verbose)) <= 80
    assert "to calibrate: codemill calibrate --seeds 10 --from-champion (about 15 min here)" in lines, lines
    assert "uncalibrated (hold below 0.45)" in text
    cached = {**out, "stages": {"train": stage("cached", 0.0), "eval:bpb": stage("ran", 20.0)}}
    assert "to calibrate: codemill calibrate --seeds 10 --from-champion (10 x train + eval)" in \
        summary_lines(cached, 1.0)
    calibrated = {**out, "gate": {**gate, "calibrated": True, "metrics": [{**metric, "calibrated": True}]}}
    assert not any(line.startswith("to calibrate") for line in summary_lines(calibrated, 1.0))
