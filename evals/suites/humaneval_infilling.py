"""HumanEval infilling pass@1 (greedy), judged in the sandbox: ``evals.infilling`` builds the tasks and the
fill-in-the-middle prompts; the middle the model writes is put back between the solution's prefix and suffix
and the whole is judged as the completion of the HumanEval prompt, through the humaneval suite's judge harness
(``problems.rewards.score``). A model whose tokenizer has no FIM sentinels is skipped, with the reason."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import polars as pl
from pydantic import Field, model_validator

from codemill.evals import humaneval as he
from codemill.evals import infilling as inf
from codemill.evals.stats import ItemScores
from codemill.evals.suites.base import EvalModel, Metric, Rows, Suite, SuiteRun, ci, scores
from codemill.evals.suites.humaneval import humaneval_dataset, suite_pool
from codemill.problems.humaneval import load_problems
from codemill.sandbox.judge_pool import JudgePool
from codemill.stage_config import StageConfig, runtime_only

if TYPE_CHECKING:
    from codemill.evals.config import EvalConfig  # the section built from this registry

InfillingType = Literal["single_line", "multi_line", "random_span"]


class HumanEvalInfillingSuiteConfig(StageConfig):
    types: list[InfillingType] = Field(["single_line", "multi_line", "random_span"], min_length=1,
                                       description="Task types (Bavarian et al. 2022): single_line (each non-blank "
                                       "line of a canonical solution), multi_line (each span of whole lines), "
                                       "random_span (10 spans per problem between random characters).")
    mode: Literal["psm", "spm"] = Field("psm", description="FIM prompt order, as training builds it: psm "
                                        "(prefix, suffix, then the middle) or spm (suffix, then prefix + middle).")
    max_tasks_per_type: int | None = Field(None, gt=0, description="At most this many tasks of each type (a fixed "
                                           "subsample by task-id hash, spread over the problems); empty = all.")
    max_new_tokens: int = Field(64, gt=0, description="Most tokens generated per middle (generation also stops at "
                                                      "EOS or a FIM sentinel).")
    context_len: int = Field(512, ge=16, description="Prompt tokens kept (the prefix loses its start, the suffix "
                                                     "its end) plus new tokens.")
    wall_s: float = Field(10.0, gt=0, description="Wall-clock limit per program.")
    cpu_s: int = Field(10, gt=0, description="Seconds of CPU per program (RLIMIT_CPU).")
    memory_mb: int = Field(1024, gt=64, description="Address space per program, in MiB (RLIMIT_AS).")
    unsafe_no_sandbox: bool = Field(False, description="Run model code WITHOUT isolation. Logged on the run.")
    workers: int | None = runtime_only(default=None, description="Parallel sandboxes; empty = CPU count.")
    batch_size: int = runtime_only(default=16, gt=0, description="Prompts per generation batch.")

    @model_validator(mode="after")
    def _room_for_a_prompt(self) -> HumanEvalInfillingSuiteConfig:
        if self.context_len < self.max_new_tokens + 16:
            raise ValueError(f"context_len ({self.context_len}) leaves no room for a prompt beside max_new_tokens "
                             f"({self.max_new_tokens}): it needs at least max_new_tokens + 16")
        return self


NAME = "humaneval_infilling"
PASS_AT_1 = Metric(f"{NAME}_pass_at_1", binary=True)
EXACT = Metric(f"{NAME}_exact_match", binary=True)
SCHEMA = {"item_id": pl.String, "cluster": pl.String, "type": pl.String, "middle": pl.String,
          "prediction": pl.String, "outcome": pl.String, "error": pl.String, "exact_match": pl.Float64}


def type_metric(kind: str, metric: str = "pass_at_1") -> str:
    """A per-type summary key, e.g. ``humaneval_infilling_single_line_pass_at_1``."""
    return f"{NAME}_{kind}_{metric}"


def infilling_pool(cfg: EvalConfig) -> JudgePool:
    return suite_pool(cfg.humaneval_infilling)


def skip_reason(m: EvalModel) -> str | None:
    return inf.missing_sentinels_reason(m.tokenizer.get_vocab())


def infill(m: EvalModel, tasks: list[inf.InfillTask], cfg: EvalConfig) -> list[str]:
    """The greedy middle of every task: its FIM prompt at the id level, generation until EOS, a FIM sentinel
    or ``max_new_tokens``. Prompts go through generation shortest first (less padding), answers in task order."""
    from codemill.models.engines import RolloutParams

    h, tok = cfg.humaneval_infilling, m.tokenizer
    ids = inf.fim_ids(tok.get_vocab())
    if ids is None:
        raise ValueError(skip_reason(m))

    def encode(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    prompts = [inf.fim_prompt(encode, ids, t.prefix, t.suffix, h.mode, h.context_len - h.max_new_tokens)
               for t in tasks]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    stops = (tok.eos_token_id, ids.prefix, ids.middle, ids.suffix)
    greedy = RolloutParams(temperature=0, max_new_tokens=h.max_new_tokens, stop_token_ids=stops)
    with m.engine(h.batch_size, h.context_len) as engine:
        done = engine.generate_ids([prompts[i] for i in order], 1, greedy, [0] * len(order))
    out = [""] * len(tasks)
    for i, cs in zip(order, done, strict=True):
        row = cs[0].completion_ids
        row = row[:-1] if row and row[-1] in stops else row  # the middle ends before its stop token
        out[i] = str(tok.decode(row, skip_special_tokens=True, clean_up_tokenization_spaces=False))
    return out


def score_middles(tasks: list[inf.InfillTask], middles: list[str], cfg: EvalConfig, pool: JudgePool) -> Rows:
    """Judge each task's program (solution prefix + middle + solution suffix after the prompt) and aggregate:
    pass@1 and exact match overall and per type, CIs resampling problems (a problem's tasks share a cluster)."""
    problems = load_problems()
    results = he.execute(problems, [{"task_id": t.problem_id, "completion": t.completion(mid)}
                                    for t, mid in zip(tasks, middles, strict=True)], pool)
    rows = pl.DataFrame({"item_id": [t.task_id for t in tasks], "cluster": [t.problem_id for t in tasks],
                         "type": [t.type for t in tasks], "middle": [t.middle for t in tasks],
                         "prediction": middles, "outcome": [r.outcome for r in results],
                         "error": [r.error for r in results],
                         "exact_match": [float(p == t.middle) for p, t in zip(middles, tasks, strict=True)]},
                        schema=SCHEMA)
    h = cfg.humaneval_infilling
    summary: dict[str, Any] = {"tasks": dict(Counter(t.type for t in tasks)), "problems": rows["cluster"].n_unique(),
                               "mode": h.mode, "unsafe_no_sandbox": h.unsafe_no_sandbox, "sandbox": pool.isolation,
                               "outcomes": dict(Counter(r.outcome for r in results)),
                               "suspicious": dict(Counter(r.suspicious for r in results if r.suspicious))}
    summary.update(_aggregate(rows, cfg, PASS_AT_1.name, EXACT.name))
    for kind in inf.TASK_TYPES:
        part = rows.filter(pl.col("type") == kind)
        if part.height:
            summary.update(_aggregate(part, cfg, type_metric(kind), type_metric(kind, "exact_match")))
    return rows, summary


def _aggregate(rows: pl.DataFrame, cfg: EvalConfig, passed_key: str, exact_key: str) -> dict[str, Any]:
    passed = (rows["outcome"] == "passed").cast(pl.Float64).to_numpy()
    clusters, ones = rows["cluster"].to_numpy(), np.ones(rows.height)
    return {**ci(passed, ones, clusters, cfg, passed_key), **ci(rows["exact_match"].to_numpy(), ones, clusters, cfg,
                                                               exact_key)}


def skipped(reason: str) -> Rows:
    """No rows and no metrics (not zeros): the suite does not apply to this model."""
    return pl.DataFrame(schema=SCHEMA), {"skipped": reason}


def run(r: SuiteRun) -> Rows:
    cfg = r.cfg
    h = cfg.humaneval_infilling
    reason = skip_reason(r.model)
    if reason:
        return skipped(reason)
    tasks = inf.make_tasks(load_problems().values(), h.types, h.max_tasks_per_type)
    with infilling_pool(cfg) as pool:  # probes first: fail closed before generating anything
        middles = infill(r.model, tasks, cfg)
        return score_middles(tasks, middles, cfg, pool)


def item_scores(rows: pl.DataFrame) -> dict[str, ItemScores]:
    if rows.height == 0:  # skipped: nothing to compare
        return {}
    rows = rows.sort("item_id").with_columns(passed=(pl.col("outcome") == "passed").cast(pl.Float64))
    return {PASS_AT_1.name: scores(rows, PASS_AT_1, "passed"), EXACT.name: scores(rows, EXACT, "exact_match")}


SUITE = Suite(NAME, inf.INFILLING_CODE_VERSION, run, item_scores, (PASS_AT_1, EXACT),
              logged=(f"{NAME}_",), uses_sandbox=lambda cfg: not cfg.humaneval_infilling.unsafe_no_sandbox,
              generates=True, settings=HumanEvalInfillingSuiteConfig, dataset=humaneval_dataset)
