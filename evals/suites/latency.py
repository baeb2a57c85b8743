"""Serving latency of the checkpoint on this machine (``evals.latency`` measures; this module picks the prompts).

The prompts are the completion suite's items (its val files, the eval seed's target lines), ``prompts`` of them
evenly spaced, left-truncated to ``evaluate.completion.context_len - max_new_tokens`` tokens. The digest holds
the machine's identity (``plan_config``): the number is a property of checkpoint x machine, so another machine
measures again, and the task refuses to run where the plan was not made for (a worker on other hardware).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from pydantic import Field

from codemill.evals import completion as comp
from codemill.evals import latency as lat
from codemill.evals.gate import ItemScores
from codemill.evals.suites.base import Metric, Rows, Suite, SuiteRun, scores
from codemill.evals.suites.completion import completion_items
from codemill.stage_config import StageConfig

if TYPE_CHECKING:
    from codemill.evals.config import EvalConfig  # the section built from this registry


class LatencySuiteConfig(StageConfig):
    """Serving latency at batch size 1 (``evals.latency``). The prompts are the completion suite's items
    (``evaluate.completion.max_files`` val files, the eval seed's target lines) at its ``context_len``. The
    digest also holds the machine (``evals.latency.machine_identity``): another machine measures again, a rerun
    on the same one is a cache hit."""

    prompts: int = Field(16, ge=1, description="Timed prompts, evenly spaced over the completion items.")
    max_new_tokens: int = Field(32, ge=2, description="New tokens per prompt, always all of them (no stop at EOS "
                                                      "or end of line): every prompt times the same work.")
    warmup_prompts: int = Field(2, ge=0, description="Untimed runs before the timed ones (the first prompts "
                                                     "again).")
    threads: int | None = Field(None, ge=1, description="torch intra-op threads while timing (restored after); "
                                "empty = the process's own. Part of the machine's identity.")
    label: str = Field("", description="Hashed with the machine's identity: set it (e.g. to the host name) to "
                                       "keep machines of one hardware class apart, or change it to measure again.")


LATENCY_CODE_VERSION = "eval-latency-v1"
TTFT = Metric("latency_ttft_ms", higher_is_better=False)  # per item: its time to first token
PER_TOKEN = Metric("latency_per_token_ms", higher_is_better=False)  # per item: its mean decode step


def pick(n_items: int, n: int) -> list[int]:
    """``n`` evenly spaced indices of ``n_items`` (all of them when there are no more): spread over the val
    files' repositories instead of the first few."""
    if n >= n_items:
        return list(range(n_items))
    return [i * n_items // n for i in range(n)]


def prompts(r: SuiteRun) -> tuple[list[comp.CompletionItem], list[list[int]]]:
    """The timed items and their prompt tokens (left-truncated as the completion suite truncates)."""
    cfg = r.cfg
    items = completion_items(r)
    items = [items[i] for i in pick(len(items), cfg.latency.prompts)]
    if not items:
        raise ValueError("no latency prompts: the val files have no lines to complete")
    budget = max(1, cfg.completion.context_len - cfg.latency.max_new_tokens)
    tok = r.model.tokenizer
    return items, [list(tok(it.prefix, add_special_tokens=False)["input_ids"][-budget:]) for it in items]


def plan_config(cfg: EvalConfig) -> dict[str, Any]:
    """The completion settings the prompts come from, and the machine the numbers will belong to."""
    return {"prompts_from": {"max_files": cfg.completion.max_files, "context_len": cfg.completion.context_len},
            "machine": lat.machine_identity(cfg.latency.label, cfg.latency.threads)}


def run(r: SuiteRun) -> Rows:
    lc = r.cfg.latency
    here = lat.machine_identity(lc.label, lc.threads)
    planned = r.planned.get("machine")
    if planned is not None and planned != here:
        raise RuntimeError(f"latency was planned for machine {planned} but runs on {here}: its number would be "
                           "stored under the wrong machine; plan and evaluate on the same machine")
    items, ids = prompts(r)
    probe = lat.HFLatencyProbe(r.model.model, r.model.device)
    with lat.torch_threads(lc.threads):
        timed = lat.measure_prompts(probe, ids, lc.max_new_tokens, lc.warmup_prompts)
        info = probe.info()
    rows = pl.DataFrame([{"item_id": it.item_id, "cluster": it.cluster, **lat.item_row(t)}
                         for it, t in zip(items, timed, strict=True)])
    summary = {**lat.summarize(timed), **info, "prompts": len(timed), "new_tokens": lc.max_new_tokens,
               "warmup_prompts": lc.warmup_prompts, "batch_size": 1, "machine": here}
    return rows, summary


def item_scores(rows: pl.DataFrame) -> dict[str, ItemScores]:
    """Per prompt, lower is better: its TTFT and its mean decode step (ms). Equal weights: every prompt timed
    the same number of new tokens."""
    return {TTFT.name: scores(rows, TTFT, "ttft_ms"),
            PER_TOKEN.name: scores(rows, PER_TOKEN, "per_token_mean_ms", np.ones(rows.height))}


SUITE = Suite("latency", LATENCY_CODE_VERSION, "val", run, item_scores, (TTFT, PER_TOKEN), logged=("latency_",),
              plan_config=plan_config, settings=LatencySuiteConfig)
