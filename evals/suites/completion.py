"""Next-line completion on the val split (``evals.completion`` builds the items and scores a line)."""

from __future__ import annotations

import numpy as np
import polars as pl
from pydantic import Field

from codemill.evals import completion as comp
from codemill.evals.stats import ItemScores
from codemill.evals.suites.base import Metric, Rows, Suite, SuiteRun, ci, scores
from codemill.stage_config import StageConfig, runtime_only


class CompletionSuiteConfig(StageConfig):
    max_files: int | None = Field(200, description="One completion item per val file, at most this many.")
    context_len: int = Field(256, ge=16, description="Prompt tokens kept (left-truncated) plus new tokens.")
    max_new_tokens: int = Field(32, gt=0, description="Most tokens generated per item (generation also stops at "
                                                      "the end of the line).")
    batch_size: int = runtime_only(default=16, gt=0, description="Prompts per generation batch.")


EXACT = Metric("completion_exact_match", binary=True)
EDIT = Metric("completion_edit_similarity")


def val_files(r: SuiteRun, max_files: int | None) -> list[tuple[str, str, str]]:
    """The first ``max_files`` val files as ``make_items`` takes them: (``repo/path``, cluster, content)."""
    val, clusters = r.val(max_files)
    return [(f"{rp}/{p}", c, t) for rp, p, c, t in zip(val["repo"], val["path"], clusters, val["content"],
                                                       strict=True)]


def completion_items(r: SuiteRun) -> list[comp.CompletionItem]:
    """One item per val file (``evaluate.completion.max_files`` of them): the completion suite's items, and the
    latency suite's prompts."""
    return comp.make_items(val_files(r, r.cfg.completion.max_files), r.cfg.seed)


def run(r: SuiteRun) -> Rows:
    from codemill.models.engines import RolloutParams

    cfg = r.cfg
    sc = cfg.completion
    items = completion_items(r)
    if not items:
        raise ValueError("no completion items: the val files have no lines to complete")
    greedy = RolloutParams(temperature=0, max_new_tokens=sc.max_new_tokens, stop=("\n",))
    with r.model.engine(sc.batch_size, sc.context_len) as engine:
        done = engine.generate([it.prefix for it in items], 1, greedy, [0] * len(items))
    preds = [cs[0].text for cs in done]
    em = np.array([comp.exact_match(p, it.target) for p, it in zip(preds, items, strict=True)])
    es = np.array([comp.edit_similarity(p, it.target) for p, it in zip(preds, items, strict=True)])
    rows = pl.DataFrame({"item_id": [it.item_id for it in items], "cluster": [it.cluster for it in items],
                         "target": [it.target for it in items], "prediction": [p.strip() for p in preds],
                         "exact_match": em, "edit_similarity": es})
    cl, ones = rows["cluster"].to_numpy(), np.ones(len(items))
    summary = {**ci(em, ones, cl, cfg, EXACT.name), **ci(es, ones, cl, cfg, EDIT.name), "items": len(items)}
    return rows, summary


def item_scores(rows: pl.DataFrame) -> dict[str, ItemScores]:
    return {EXACT.name: scores(rows, EXACT, "exact_match"), EDIT.name: scores(rows, EDIT, "edit_similarity")}


SUITE = Suite("completion", comp.COMPLETION_CODE_VERSION, run, item_scores, (EXACT, EDIT),
              generates=True, headline=EDIT.name,  # a small model's exact matches are mostly 0
              settings=CompletionSuiteConfig)
