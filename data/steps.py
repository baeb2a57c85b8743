"""Ingest steps as values: each declares its name, the rejection reasons it can give and a vectorised function
over a chunk's rows (a Polars frame), after datatrove's ``PipelineStep`` / ``BaseFilter``.

A chunk runs through the steps that have a function, in order. A step sees only the rows no earlier step
rejected (``reason`` null) and returns them with its columns added and ``reason`` set on the rows it rejects,
with a reason it declares. A rejected row leaves the pipeline carrying the columns of the steps that saw it
(null in the others). Steps without a function run elsewhere (reading the source, the corpus-wide dedup) and
are listed for their reasons: the manifest's counts by step and reason come from one list of steps
(``data.ingest.STEPS``), so adding a step is one value in the module that holds its code, plus its place there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from codemill.data.shingles import token_hashes

if TYPE_CHECKING:
    from codemill.data.config import IngestConfig
    from codemill.data.decontaminate import NgramIndex


@dataclass(frozen=True)
class Processing:
    """Everything a worker needs to process a chunk: picklable, so chunks can run on other processes."""

    cfg: IngestConfig
    bands: int
    rows: int
    index: NgramIndex | None
    digest: str


class ChunkContext:
    """What the steps of one chunk share: the processing config and one tokenisation (decontamination and
    MinHash read the same token hashes; a later step's rows are a subset of an earlier one's)."""

    def __init__(self, proc: Processing) -> None:
        self.proc = proc
        self._rows: np.ndarray | None = None
        self._flat = np.empty(0, np.uint64)
        self._lengths = np.empty(0, np.int64)

    def tokens(self, live: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(flat token hashes, tokens per row) of ``live``'s content, in its row order."""
        rows = live["row"].to_numpy()
        if self._rows is not None and np.array_equal(self._rows, rows):
            return self._flat, self._lengths  # the same rows (no step in between rejected one): no copy
        if self._rows is not None:
            keep = np.isin(self._rows, rows)
            if np.array_equal(self._rows[keep], rows):
                return self._flat[np.repeat(keep, self._lengths)], self._lengths[keep]
        self._flat, self._lengths = token_hashes(live["content"])
        self._rows = rows
        return self._flat, self._lengths


StepFn = Callable[[pl.DataFrame, ChunkContext], pl.DataFrame]


@dataclass(frozen=True)
class Step:
    name: str
    reasons: tuple[str, ...] = ()
    apply: StepFn | None = None  # None: done outside the chunk pipeline (reading, corpus-wide dedup)


def reject(cond: pl.Expr, reason: str) -> pl.Expr:
    """The ``reason`` column with ``reason`` set where ``cond`` holds on a row no step has rejected yet."""
    return (pl.when(pl.col("reason").is_null() & cond).then(pl.lit(reason)).otherwise(pl.col("reason"))
            .alias("reason"))


def check_reasons(rejected: pl.DataFrame, step: Step) -> None:
    """A step may only reject with a reason it declares (an undeclared one would be counted nowhere)."""
    undeclared = set(rejected["reason"].unique().to_list()) - set(step.reasons)
    if undeclared:
        raise ValueError(f"ingest step {step.name!r} rejected rows with undeclared reasons {sorted(undeclared)}")


def run_steps(df: pl.DataFrame, steps: Iterable[Step], ctx: ChunkContext) -> pl.DataFrame:
    """Every row of ``df`` (with a ``row`` index), in row order; rejected rows lose their content."""
    is_rejected = pl.col("reason").is_not_null()
    parts = [df.filter(is_rejected)]
    live = df.filter(~is_rejected)
    for step in steps:
        if step.apply is None:
            continue
        live = step.apply(live, ctx)
        gone = live.filter(is_rejected)
        check_reasons(gone, step)
        parts.append(gone)
        live = live.filter(~is_rejected)
    out = pl.concat([*parts, live], how="diagonal_relaxed")
    return out.with_columns(pl.when(~is_rejected).then(pl.col("content")).alias("content")).sort("row")


def step_of(reason: str, steps: Iterable[Step]) -> Step:
    """The step that declares ``reason``; a reason no step declares is a bug, not a silent 'read'."""
    for step in steps:
        if reason in step.reasons:
            return step
    raise ValueError(f"rejection reason {reason!r} is not declared by any ingest step")
