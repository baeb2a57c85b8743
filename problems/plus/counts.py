"""The augmentation's per-problem counts (what was seeded, generated, kept, and which mutants the tests kill):
written beside the augmented tests and beside a problem set whose tests were augmented, totalled for the
manifest."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from codemill.problems.plus.augment import Counts, counts_rows

COUNTS_FILE = "counts.parquet"
TOTALS = ("seeded", "generated", "rejected", "kept", "new_cases", "original_asserts", "mutants", "killed_by_kept",
          "killed_by_original", "killed_by_augmented")


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


def read_counts(art_dir: Path) -> list[dict[str, Any]]:
    return pl.read_parquet(art_dir / COUNTS_FILE).to_dicts()
