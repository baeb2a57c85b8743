"""Serving latency of the checkpoint on this machine (``evals.latency`` measures; this module picks the prompts).

The prompts are the completion suite's items (its val files, the eval seed's target lines), ``prompts`` of them
evenly spaced, left-truncated to ``evaluate.completion.context_len - max_new_tokens`` tokens. The digest holds
the machine's identity (``plan_config``): the number is a property of checkpoint x machine, so another machine
measures again, and the task refuses to run where the plan was not made for (a worker on other hardware).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from pydantic import Field

from codemill.evals import completion as comp
from codemill.evals import latency as lat
from codemill.evals.stats import ItemScores
from codemill.evals.suites.base import Metric, Rows, Suite, SuiteRun, scores
from codemill.evals.suites.completion import completion_items
from codemill.layout import LOG_WIDTH, wrap
from codemill.stage_config import StageConfig
from codemill.store import Manifest

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
# Milliseconds, lower is better. Seed noise does not describe latency: the hold margin is the default's number.
TTFT = Metric("latency_ttft_ms", higher_is_better=False, unit="ms",
              reading="ms, lower is faster")  # per item: its time to first token
PER_TOKEN = Metric("latency_per_token_ms", higher_is_better=False, unit="ms",
                   reading="ms, lower is faster")  # per item: its mean decode step
DESCRIBED = ("engine", "device", "dtype")  # what the numbers were measured on, kept beside them in a run's result
RAN_ON = (*DESCRIBED, "engine_version", "torch", "threads")  # ... and tagged on the evaluate run


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


def summary_line(scores: Mapping[str, Any], step: Mapping[str, Any]) -> str | None:
    """The run summary's latency line, p50/p95 (None when the suite did not run), on the device its step ran
    on; wrap it at 80 columns."""
    return latency_line(scores, step.get("device"))


def latency_line(scores: Mapping[str, Any], device: str | None = None) -> str | None:
    """The latency line, p50/p95 (None when the suite did not run); wrap it at 80 columns."""
    s = scores
    if "latency_ttft_p50_ms" not in s:
        return None
    line = f"latency p50/p95: TTFT {s['latency_ttft_p50_ms']:.2f}/{s['latency_ttft_p95_ms']:.2f} ms"
    if "latency_per_token_p50_ms" in s:
        line += f", per token {s['latency_per_token_p50_ms']:.2f}/{s['latency_per_token_p95_ms']:.2f} ms"
    return line + f", {s['latency_tokens_per_s']:.0f} tok/s" + (f" on {device}" if device else "")


LATENCY_KEYS = ("latency_ttft_p50_ms", "latency_ttft_p95_ms", "latency_per_token_p50_ms",
                "latency_per_token_p95_ms", "latency_tokens_per_s")


def latency_side_by_side(a: Manifest, b: Manifest) -> dict[str, Any]:
    """The two latency summaries (a, b) and what they were measured on (one machine: they paired)."""
    return {"a": {k: a.stats.get(k) for k in LATENCY_KEYS}, "b": {k: b.stats.get(k) for k in LATENCY_KEYS},
            "on": {k: b.stats.get(k) for k in ("device", "dtype", "engine", "engine_version", "threads")},
            "prompts": b.stats.get("prompts"), "new_tokens": b.stats.get("new_tokens")}


LATENCY_ROWS = (("TTFT p50", "latency_ttft_p50_ms", "ms"), ("TTFT p95", "latency_ttft_p95_ms", "ms"),
                ("per token p50", "latency_per_token_p50_ms", "ms"),
                ("per token p95", "latency_per_token_p95_ms", "ms"), ("tokens/s", "latency_tokens_per_s", ""))


def latency_table(side: Mapping[str, Any], width: int = LOG_WIDTH) -> list[str]:
    """Two checkpoints' latency side by side (lower is better but for tokens/s), and where it was measured."""
    on = side.get("on") or {}
    head = (f"latency, batch 1, {side.get('prompts')} prompts x {side.get('new_tokens')} new tokens, same machine: "
            f"{on.get('device')} {on.get('dtype')}, {on.get('engine')} {on.get('engine_version')}, "
            f"{on.get('threads')} threads")
    lines = [*wrap(head, width), f"  {'':<16}{'a':>12}{'b':>12}{'a / b':>10}"]
    for label, key, unit in LATENCY_ROWS:
        va, vb = side["a"].get(key), side["b"].get(key)
        if va is None or vb is None:
            continue
        ratio = f"{va / vb:>10.2f}" if vb else f"{'-':>10}"
        lines.append(f"  {(label + (' ' + unit if unit else '')):<16}{va:>12.3f}{vb:>12.3f}{ratio}")
    return lines


SUITE = Suite("latency", LATENCY_CODE_VERSION, run, item_scores, (TTFT, PER_TOKEN), logged=("latency_",),
              plan_config=plan_config, settings=LatencySuiteConfig, described=DESCRIBED, run_tags=RAN_ON,
              summary_line=summary_line, side_by_side=latency_side_by_side, compare_lines=latency_table)
