"""HumanEval pass@1 (greedy) and sampled pass@k, judged in the sandbox (``evals.humaneval``); with
``humaneval.plus``, the greedy completions judged a second time against the augmented tests of the augment stage
(``problems.plus``): ``humaneval_plus_pass_at_1`` beside ``humaneval_pass_at_1``, on the same problems and with the
same CI method, and every greedy row carrying both verdicts (``outcome`` and ``plus_outcome``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from pydantic import Field

from codemill.evals import humaneval as he
from codemill.evals.stats import ItemScores
from codemill.evals.suites.base import EvalModel, Metric, Need, Rows, Suite, SuiteRun, ci, scores
from codemill.hashing import sha256_file
from codemill.problems.humaneval import load_problems, problems_file
from codemill.problems.plus.artifact import STAGE as AUGMENT_STAGE
from codemill.problems.plus.artifact import evaluation_config
from codemill.problems.problem import ExecProblem
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool
from codemill.stage_config import StageConfig, runtime_only
from codemill.store import ArtifactRef

if TYPE_CHECKING:
    from codemill.config import PipelineConfig
    from codemill.evals.config import EvalConfig  # the section built from this registry
    from codemill.evals.suites.humaneval_infilling import HumanEvalInfillingSuiteConfig


class HumanEvalSuiteConfig(StageConfig):
    max_problems: int | None = Field(None, description="First N of the 164 problems; empty = all.")
    greedy: bool = Field(True, description="One greedy completion per problem (pass@1).")
    n_samples: int = Field(0, ge=0, description="Sampled completions per problem for pass@k (0 = off).")
    temperature: float = Field(0.8, gt=0, description="Sampling temperature of the pass@k samples (greedy "
                                                      "ignores it).")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus (top-p) cutoff of the pass@k samples; 1 = off.")
    ks: list[int] = Field([1, 10], description="k values of sampled pass@k (those <= n_samples are reported).")
    max_new_tokens: int = Field(128, gt=0, description="Most tokens generated per completion (generation also "
                                                       "stops at HumanEval's stop sequences).")
    context_len: int = Field(512, ge=16, description="Prompt tokens kept (left-truncated) plus new tokens.")
    wall_s: float = Field(10.0, gt=0, description="Wall-clock limit per program (the reference uses 3 s).")
    cpu_s: int = Field(10, gt=0, description="Seconds of CPU per program (RLIMIT_CPU).")
    memory_mb: int = Field(1024, gt=64, description="Address space per program, in MiB (RLIMIT_AS).")
    unsafe_no_sandbox: bool = Field(False, description="Run model code WITHOUT isolation. Logged on the run.")
    plus: bool = runtime_only(default=True, description="Judge the greedy completions a second time against the "
                              "augmented tests of the augment stage (humaneval_plus_pass_at_1). Not hashed as a "
                              "setting: the evaluation's digest covers it through its input, the augmented "
                              "artifact, and humaneval_pass_at_1 does not depend on it.")
    workers: int | None = runtime_only(default=None, description="Parallel sandboxes; empty = CPU count.")
    batch_size: int = runtime_only(default=16, gt=0, description="Prompts per generation batch.")


PASS_AT_1 = Metric("humaneval_pass_at_1", binary=True)
PLUS_PASS_AT_1 = Metric("humaneval_plus_pass_at_1", binary=True)
SAMPLED_PREFIX = "humaneval_sampled_pass_at_"
PLUS_INPUT = "plus"  # the plan input that holds the augmented tests


def humaneval_dataset() -> ArtifactRef:
    """HumanEval's problem file, by content: the ``data`` input of the suites that read it."""
    path = problems_file()
    return ArtifactRef(stage="benchmark", name="humaneval", digest=sha256_file(path), uri=str(path))


def needs(config: PipelineConfig) -> tuple[Need, ...]:
    """With ``plus``, the augmented tests of the problems the suite judges, built by the augment stage before it."""
    h = config.evaluate.humaneval
    return (Need(AUGMENT_STAGE, evaluation_config(config.augment, h.max_problems), PLUS_INPUT),) if h.plus else ()


def suite_pool(section: HumanEvalSuiteConfig | HumanEvalInfillingSuiteConfig) -> JudgePool:
    """The judge pool of a suite that runs model code, from its section's sandbox limits; entering it probes the
    sandbox, so it fails closed before any model code runs."""
    return JudgePool(Limits.of(section), workers=section.workers, unsafe=section.unsafe_no_sandbox)


def humaneval_pool(cfg: EvalConfig) -> JudgePool:
    return suite_pool(cfg.humaneval)


def humaneval_samples(m: EvalModel, problems: dict[str, ExecProblem], cfg: EvalConfig) -> list[dict]:
    """Greedy (mode=greedy) and sampled (mode=sampled) completions from the sampling engine RL uses, generation
    kept apart from execution. A problem's samples are seeded by the eval seed and its task id, so they do not
    depend on the batching or on the other problems."""
    from codemill.models.engines import RolloutParams, derive_seed

    h = cfg.humaneval
    out: list[dict] = []
    ids = list(problems)
    prompts = [problems[t].prompt for t in ids]
    with m.engine(h.batch_size, h.context_len) as engine:
        if h.greedy:
            greedy = RolloutParams(temperature=0, max_new_tokens=h.max_new_tokens, stop=tuple(he.STOP_SEQUENCES))
            done = engine.generate(prompts, 1, greedy, [0] * len(ids))
            out += [{"task_id": t, "completion": cs[0].text, "mode": "greedy"}
                    for t, cs in zip(ids, done, strict=True)]
        if h.n_samples:
            sampled = RolloutParams(temperature=h.temperature, top_p=h.top_p, max_new_tokens=h.max_new_tokens,
                                    stop=tuple(he.STOP_SEQUENCES))
            done = engine.generate(prompts, h.n_samples, sampled,
                                   [derive_seed("humaneval", cfg.seed, t) for t in ids])
            out += [{"task_id": t, "completion": c.text, "mode": "sampled"} for t, cs in zip(ids, done, strict=True)
                    for c in cs]
    return out


def score_humaneval(samples: list[dict], problems: dict[str, ExecProblem], cfg: EvalConfig,
                    pool: JudgePool, plus: dict[str, ExecProblem] | None = None) -> Rows:
    """Execute samples (from generation or a samples file) and aggregate by problem; ``plus`` (the augmented
    problems) judges the greedy samples again."""
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
            if plus is not None:
                summary.update(_score_plus(chosen, plus, cfg, pool, rows_all))
        else:
            ks = [k for k in h.ks if k <= h.n_samples]
            found = he.pass_at_k_scores(results, ks)
            summary.update({f"{SAMPLED_PREFIX}{k.removeprefix('pass@')}": v for k, v in found.items()})
        summary[f"{mode}_outcomes"] = dict(Counter(r.outcome for r in results))
        summary[f"{mode}_suspicious"] = dict(Counter(r.suspicious for r in results if r.suspicious))
    return pl.DataFrame(rows_all), summary


def _score_plus(greedy: list[dict], plus: dict[str, ExecProblem], cfg: EvalConfig, pool: JudgePool,
                rows_all: list[dict]) -> dict[str, Any]:
    """The greedy samples against the augmented tests: each greedy row gets ``plus_outcome``/``plus_passed``,
    and the summary the plus pass@1 with its CI (the problem is the unit, as for pass@1)."""
    results = he.execute(plus, greedy, pool)
    greedy_rows = [r for r in rows_all if r["mode"] == "greedy"]
    for row, res in zip(greedy_rows, results, strict=True):
        row["plus_outcome"], row["plus_passed"] = res.outcome, res.passed
    counts = he.per_problem(results)
    frac = np.array([c / n for n, c in counts.values()])
    out = ci(frac, np.ones_like(frac), np.arange(frac.size), cfg, PLUS_PASS_AT_1.name)
    out["plus_outcomes"] = dict(Counter(r.outcome for r in results))
    out["plus_only_failures"] = sum(1 for row in greedy_rows if row["outcome"] == "passed" and not row["plus_passed"])
    return out


def plus_problems(plus_dir: Path | None, problems: dict[str, ExecProblem]) -> dict[str, ExecProblem]:
    """The augmented version of each of ``problems`` (from the augment artifact); the suite refuses to run
    without it when ``plus`` is on, rather than report a plus score that is not one."""
    from codemill.problems.plus.artifact import read_augmented

    if plus_dir is None:
        raise ValueError("humaneval.plus is on but the evaluation was planned without the augmented tests "
                         "(the augment step); plan it with flows.plan.plan_evaluations (EvalPlan.steps) or set "
                         "humaneval.plus: false")
    augmented = read_augmented(plus_dir)
    missing = sorted(set(problems) - set(augmented))
    if missing:
        raise ValueError(f"{plus_dir}: the augmented tests lack {len(missing)} problems ({', '.join(missing[:3])})")
    return {k: augmented[k] for k in problems}


def run(r: SuiteRun) -> Rows:
    cfg = r.cfg
    problems = load_problems()
    if cfg.humaneval.max_problems:
        problems = dict(list(problems.items())[: cfg.humaneval.max_problems])
    plus = plus_problems(r.inputs.get(PLUS_INPUT), problems) if cfg.humaneval.plus else None
    with humaneval_pool(cfg) as pool:  # probes first: fail closed before generating anything
        if r.samples_file:
            samples = [{**s, "mode": "greedy"} for s in he.read_samples(r.samples_file)]
        else:
            samples = humaneval_samples(r.model, problems, cfg)
        he.write_samples(r.path("samples.jsonl"), samples)
        return score_humaneval(samples, problems, cfg, pool, plus)


def item_scores(rows: pl.DataFrame) -> dict[str, ItemScores]:
    greedy = rows.filter(pl.col("mode") == "greedy").sort("item_id")
    if greedy.height == 0:
        return {}
    out = {PASS_AT_1.name: scores(greedy.with_columns(passed=(pl.col("outcome") == "passed").cast(pl.Float64)),
                                  PASS_AT_1, "passed")}
    if "plus_outcome" in greedy.columns:
        out[PLUS_PASS_AT_1.name] = scores(greedy.with_columns(
            plus=(pl.col("plus_outcome") == "passed").cast(pl.Float64)), PLUS_PASS_AT_1, "plus")
    return out


SUITE = Suite("humaneval", he.HUMANEVAL_CODE_VERSION, run, item_scores, (PASS_AT_1, PLUS_PASS_AT_1),
              logged=(SAMPLED_PREFIX, "plus_only_failures"),
              uses_sandbox=lambda cfg: not cfg.humaneval.unsafe_no_sandbox or cfg.humaneval.plus,
              generates=True, settings=HumanEvalSuiteConfig, needs=needs, dataset=humaneval_dataset,
              scores_samples=True)
