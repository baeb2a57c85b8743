"""The augmented problem set on disk: ``problems.parquet`` (``problem_sets.PROBLEM_SCHEMA``) and ``counts.parquet``
(one row per problem: inputs seeded, generated, rejected by reason, kept, new cases after reduction, mutants,
killed by the original and by the augmented tests), plus the totals for the manifest."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from codemill.problems.plus.augment import Counts, counts_rows
from codemill.problems.problem import ExecProblem
from codemill.problems.sets import PROBLEM_SCHEMA, PROBLEMS_FILE, read_problem_set

COUNTS_FILE = "counts.parquet"
TOTALS = ("seeded", "generated", "rejected", "kept", "new_cases", "original_asserts", "mutants", "killed_by_kept",
          "killed_by_original", "killed_by_augmented")


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


def write_counts(out_dir: Path, counts: Sequence[Counts], name: str = COUNTS_FILE) -> dict[str, Any]:
    """The per-problem counts as Parquet; their totals (for the manifest)."""
    pl.DataFrame(counts_rows(counts)).write_parquet(out_dir / name, compression="zstd")
    return augment_stats(counts)


def augment_stats(counts: Sequence[Counts]) -> dict[str, Any]:
    rows = counts_rows(counts)
    return {"problems": len(rows), "augmented": sum(c.new_cases > 0 and not c.fallback for c in counts),
            "fallback": {c.problem_id: c.fallback for c in counts if c.fallback},
            "reference_passes": sum(c.reference_passes for c in counts),
            "totals": {k: int(sum(r[k] for r in rows)) for k in TOTALS}}


def read_augmented(art_dir: Path) -> dict[str, ExecProblem]:
    """problem_id -> the augmented problem, from a committed artifact folder."""
    return {p.problem_id: p for p in read_problem_set(art_dir / PROBLEMS_FILE)}


def read_counts(art_dir: Path) -> list[dict[str, Any]]:
    return pl.read_parquet(art_dir / COUNTS_FILE).to_dicts()
