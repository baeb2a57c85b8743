"""The augmented problem set on disk: ``problems.parquet`` (``problem_sets.PROBLEM_SCHEMA``) and ``counts.parquet``
(one row per problem: inputs seeded, generated, rejected by reason, kept, new cases after reduction, mutants,
killed by the original and by the augmented tests), plus the totals for the manifest; the augment stage's plan
and its build into a store writer (the task, and ``plus.ship`` which builds the shipped copy, share them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from codemill.plan import StagePlan, file_input
from codemill.problems.config import AugmentConfig
from codemill.problems.plus.augment import PLUS_CODE_VERSION, Counts
from codemill.problems.plus.counts import write_counts
from codemill.problems.problem import ExecProblem
from codemill.problems.sets import PROBLEM_SCHEMA, PROBLEMS_FILE, read_problem_set
from codemill.store import ArtifactWriter, Manifest

STAGE = "augment"
NAME = "humaneval-plus"
def write_augmented(out_dir: Path, problems: Sequence[ExecProblem], counts: Sequence[Counts],
                    split: str = "test") -> dict[str, Any]:
    """Write both files; the stats (totals, problems augmented and fallen back) for the manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"problem_id": p.problem_id, "prompt": p.prompt, "entry_point": p.entry_point, "tests": p.tests,
             "test_cases": list(p.test_cases), "reference_solution": p.reference_solution, "source": p.source,
             "split_unit": p.split_unit, "split": split, "verified": p.reference_solution is not None}
            for p in problems]
    pl.DataFrame(rows, schema=PROBLEM_SCHEMA).write_parquet(out_dir / PROBLEMS_FILE, compression="zstd")
    return write_counts(out_dir, counts)


def read_augmented(art_dir: Path) -> dict[str, ExecProblem]:
    """problem_id -> the augmented problem, from a committed artifact folder."""
    return {p.problem_id: p for p in read_problem_set(art_dir / PROBLEMS_FILE)}


def evaluation_config(augment: AugmentConfig, max_problems: int | None) -> AugmentConfig:
    """The augment settings the humaneval suite's tests come from: the ``augment`` section, on the problems the
    suite judges (``evaluate.humaneval.max_problems``)."""
    return augment.model_copy(update={"max_problems": max_problems})


def plan_augment(cfg: AugmentConfig, problems_file: str | None = None) -> StagePlan:
    """Inputs: the HumanEval problem file (its content digest); config: the whole ``AugmentConfig`` less the
    runtime-only knobs."""
    from codemill.problems.humaneval import problems_file as humaneval_file

    return StagePlan(stage=STAGE, name=NAME, code_version=PLUS_CODE_VERSION, config=cfg.digest_config(),
                     inputs={"humaneval": file_input("humaneval", problems_file or humaneval_file())})


def build_augmented(w: ArtifactWriter, cfg: AugmentConfig, say: Callable[[str], None]) -> Manifest:
    """Augment the first ``cfg.max_problems`` problems of the plan's HumanEval file in the sandbox and finish
    ``w`` with them (the stats record the judge's isolation)."""
    from codemill.problems.humaneval import load_problems
    from codemill.problems.plus.augment import augmenter

    problems = list(load_problems(w.plan.input("humaneval").uri).values())[:cfg.max_problems]
    with augmenter(cfg) as run:
        out, counts = run(problems, say)
        isolation = run.isolation
    stats = write_augmented(w.dir, out, counts)
    stats["sandbox"] = isolation
    return w.finish(stats)
