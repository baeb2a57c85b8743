"""HumanEval pass@1 (greedy) and sampled pass@k, judged in the sandbox (``evals.humaneval``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import polars as pl

from codemill.config import EvalConfig
from codemill.evals import humaneval as he
from codemill.evals.gate import ItemScores
from codemill.evals.problems import ExecProblem
from codemill.evals.sandbox import Limits
from codemill.evals.sandbox.judge_pool import JudgePool
from codemill.evals.suites.base import EvalModel, Metric, Rows, Suite, SuiteRun, ci, scores

PASS_AT_1 = Metric("humaneval_pass_at_1", binary=True)
SAMPLED_PREFIX = "humaneval_sampled_pass_at_"


def humaneval_pool(cfg: EvalConfig) -> JudgePool:
    """The judge pool of the suite; entering it probes the sandbox, so it fails closed before any model code runs."""
    h = cfg.humaneval
    return JudgePool(Limits(wall_s=h.wall_s, cpu_s=h.cpu_s, memory_bytes=h.memory_mb << 20), workers=h.workers,
                     unsafe=h.unsafe_no_sandbox)


def humaneval_samples(m: EvalModel, problems: dict[str, ExecProblem], cfg: EvalConfig) -> list[dict]:
    """Greedy (mode=greedy) and sampled (mode=sampled) completions, generation kept apart from execution."""
    from codemill.evals.generate import SamplingParams, generate

    h = cfg.humaneval
    out: list[dict] = []
    base = SamplingParams(max_new_tokens=h.max_new_tokens, stop=he.STOP_SEQUENCES)
    ids = list(problems)
    if h.greedy:
        texts = generate(m.model, m.tokenizer, [problems[t].prompt for t in ids], base, batch_size=h.batch_size,
                         max_context=h.context_len, device=m.device, seed=cfg.seed)
        out += [{"task_id": t, "completion": c, "mode": "greedy"} for t, c in zip(ids, texts, strict=True)]
    if h.n_samples:
        sampled = SamplingParams(max_new_tokens=h.max_new_tokens, temperature=h.temperature, top_p=h.top_p,
                                 stop=he.STOP_SEQUENCES)
        prompts = [problems[t].prompt for t in ids for _ in range(h.n_samples)]
        texts = generate(m.model, m.tokenizer, prompts, sampled, batch_size=h.batch_size,
                         max_context=h.context_len, device=m.device, seed=cfg.seed + 1)
        owners = [t for t in ids for _ in range(h.n_samples)]
        out += [{"task_id": t, "completion": c, "mode": "sampled"} for t, c in zip(owners, texts, strict=True)]
    return out


def score_humaneval(samples: list[dict], problems: dict[str, ExecProblem], cfg: EvalConfig,
                    pool: JudgePool) -> Rows:
    """Execute samples (from generation or a samples file) and aggregate by problem."""
    h = cfg.humaneval
    rows_all: list[dict] = []
    summary: dict[str, Any] = {"problems": len(problems), "unsafe_no_sandbox": h.unsafe_no_sandbox,
                               "sandbox": pool.isolation}
    for mode in ("greedy", "sampled"):
        chosen = [s for s in samples if s.get("mode", "greedy") == mode]
        if not chosen:
            continue
        results = he.execute(problems, chosen, pool)
        rows_all += [{**r, "mode": mode, "item_id": r["task_id"], "cluster": r["task_id"]} for r in he.rows(results)]
        counts = he.per_problem(results)
        frac = np.array([c / n for n, c in counts.values()])
        if mode == "greedy":
            summary.update(ci(frac, np.ones_like(frac), np.arange(frac.size), cfg, PASS_AT_1.name))
        else:
            ks = [k for k in h.ks if k <= h.n_samples]
            found = he.pass_at_k_scores(results, ks)
            summary.update({f"{SAMPLED_PREFIX}{k.removeprefix('pass@')}": v for k, v in found.items()})
        summary[f"{mode}_outcomes"] = dict(Counter(r.outcome for r in results))
        summary[f"{mode}_suspicious"] = dict(Counter(r.suspicious for r in results if r.suspicious))
    return pl.DataFrame(rows_all), summary


def run(r: SuiteRun) -> Rows:
    cfg = r.cfg
    problems = he.load_problems()
    if cfg.humaneval.max_problems:
        problems = dict(list(problems.items())[: cfg.humaneval.max_problems])
    with humaneval_pool(cfg) as pool:  # probes first: fail closed before generating anything
        if r.samples_file:
            samples = [{**s, "mode": "greedy"} for s in he.read_samples(r.samples_file)]
        else:
            samples = humaneval_samples(r.model, problems, cfg)
        he.write_samples(r.path("samples.jsonl"), samples)
        return score_humaneval(samples, problems, cfg, pool)


def item_scores(rows: pl.DataFrame) -> dict[str, ItemScores]:
    greedy = rows.filter(pl.col("mode") == "greedy").sort("item_id")
    if greedy.height == 0:
        return {}
    return {PASS_AT_1.name: scores(greedy.with_columns(passed=(pl.col("outcome") == "passed").cast(pl.Float64)),
                                   PASS_AT_1, "passed")}


SUITE = Suite("humaneval", he.HUMANEVAL_CODE_VERSION, "humaneval", run, item_scores, (PASS_AT_1,),
              logged=(SAMPLED_PREFIX,), uses_sandbox=lambda cfg: not cfg.humaneval.unsafe_no_sandbox)
