"""``codemill repo-tasks grade``: SWE-bench predictions in, per-instance verdicts and SWE-bench's run report out."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from codemill.repos.task import write_tasks
from tests.integration.repo_fixture import make_repo


def test_grade_command_reports_like_swe_bench(tmp_path):
    repos = tmp_path / "repos"
    repo, task = make_repo(repos)
    missing = task.__class__(**{**task.__dict__, "instance_id": "mathlib__gone-2", "base_commit": "f" * 40})
    tasks = tmp_path / "tasks.parquet"
    write_tasks([task, missing], tasks)
    preds = tmp_path / "preds.jsonl"
    lines = [{"instance_id": task.instance_id, "model_name_or_path": "gold", "model_patch": task.patch},
             {"instance_id": missing.instance_id, "model_name_or_path": "gold", "model_patch": task.patch},
             {"instance_id": "nobody__nothing-1", "model_name_or_path": "gold", "model_patch": task.patch}]
    preds.write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = tmp_path / "out" / "report.json"
    env = {**os.environ, "CODEMILL_REPO_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "codemill.cli", "repo-tasks", "grade", "--tasks", str(tasks),
                           "--predictions", str(preds), "--repos", str(repos), "--report", str(report)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"{task.instance_id}: resolved" in proc.stdout
    assert "mathlib__gone-2: error" in proc.stdout and "fetch it into that repository" in proc.stdout
    assert "nobody__nothing-1: unknown instance" in proc.stderr
    out = json.loads(report.read_text())
    assert out["resolved_ids"] == [task.instance_id] and out["error_ids"] == ["mathlib__gone-2"]
    assert out["unknown_ids"] == ["nobody__nothing-1"] and out["submitted_instances"] == 3
    assert out["total_instances"] == 2 and out["completed_ids"] == [task.instance_id]
    assert out["instances"][task.instance_id]["tests"]["tests/test_clamp.py::test_clamp_high"] == "passed"


def test_a_malformed_predictions_line_is_one_error_line(tmp_path):
    repos = tmp_path / "repos"
    _, task = make_repo(repos)
    tasks = tmp_path / "tasks.jsonl"
    write_tasks([task], tasks)
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"instance_id": "x", "model_patch": ""}\n{"instance_id": "y"}\n')
    proc = subprocess.run([sys.executable, "-m", "codemill.cli", "repo-tasks", "grade", "--tasks", str(tasks),
                           "--predictions", str(preds), "--repos", str(repos)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert f"error: {preds}:2: a prediction needs instance_id and model_patch" in proc.stderr
