"""Prefect task of the problems stage: executable problems as a content-addressed Parquet artifact."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from codemill import progress
from codemill.lineage import Lineage
from codemill.lineage import tags as T
from codemill.plan import StagePlan, external_input
from codemill.problems.config import ProblemsConfig
from codemill.problems.sets import (
    PROBLEMS_CODE_VERSION,
    corpus_files,
    fingerprint_problem_sources,
)
from codemill.store import ArtifactRef, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task

STAGE = "problems"


def needs_corpus(cfg: ProblemsConfig) -> bool:
    return any(s.kind == "mined" for s in cfg.sources)


def plan_problems(cfg: ProblemsConfig, sources: list[dict], corpus: ArtifactRef | None) -> StagePlan:
    """The problem set depends on its config, on each file source's content fingerprint and, when doctests are
    mined, on the corpus artifact."""
    inputs = {f"source.{i}.{s['name']}": external_input("problem-source", s["name"], s["fingerprint"], s["root"])
              for i, s in enumerate(sources)}
    if needs_corpus(cfg):
        if corpus is None:
            raise ValueError("a mined problem source needs the corpus artifact")
        inputs["corpus"] = corpus
    version = PROBLEMS_CODE_VERSION
    if cfg.augment is not None:
        from codemill.problems.plus.augment import PLUS_CODE_VERSION

        version += f"+{PLUS_CODE_VERSION}"
    return StagePlan(stage=STAGE, name="problems", code_version=version, config=cfg.digest_config(), inputs=inputs)


@task(name="fingerprint-problem-sources", retries=2, retry_delay_seconds=5)
def fingerprint_problem_sources_task(cfg: ProblemsConfig) -> list[dict]:
    """Content fingerprint of every file source (always runs: it is how a changed file is noticed)."""
    progress.sink().stage(STAGE, "fingerprinting problem files")
    return fingerprint_problem_sources(cfg)


def _summary(m: Manifest) -> dict[str, Any]:
    return {"problems": m.stats["problems"], "splits": m.stats["splits"], "totals": m.stats["totals"],
            "by_source": m.stats["by_source"]}


def _record(plan: StagePlan, sources: list[dict]):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        if "corpus" in plan.inputs:
            lineage.log_dataset_input(run_id, plan.input("corpus"), "input", name="corpus")
        lineage.log_dataset_input(run_id, ArtifactRef(stage=m.stage, name=m.name, digest=m.digest, uri=m.uri),
                                  "output", name="problems")
        tags: dict[str, Any] = {}
        for i, s in enumerate(sources):
            tags |= {T.problem_source(i, k): s[k] for k in ("name", "kind", "root", "fingerprint")}
        tags |= {T.sandbox(k): v for k, v in m.stats.get("sandbox", {}).items()}
        lineage.tag(run_id, tags)
        st = m.stats
        metrics = {"problems": st["problems"], **{f"{k}.problems": v for k, v in st["splits"].items()},
                   **{f"total.{k}": v for k, v in st["totals"].items()}}
        lineage.log_metrics(run_id, metrics)
        lineage.log_table(run_id, [{"source": name, **{k: v for k, v in c.items() if k != "mining"}}
                                   for name, c in st["by_source"].items()], "problems_counts.json")
        return {}
    return record


@stage_task("problems")
def problems_task(plan: StagePlan, ctx: RunContext, cfg: ProblemsConfig, sources: list[dict]) -> StageResult:
    from codemill.problems.sets import build_in_sandbox

    logger = get_run_logger()
    store = ctx.store()

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        corpus = None
        if "corpus" in plan.inputs:
            corpus_dir = store.local_path(plan.input("corpus"))
            corpus = lambda: corpus_files(corpus_dir)  # noqa: E731
        stats = build_in_sandbox(cfg, w.dir, corpus, say=lambda msg: progress.sink().stage(STAGE, msg))
        stats["source_fingerprints"] = sources
        logger.info("problems: kept %d (train %d, val %d); counts %s", stats["problems"], stats["splits"]["train"],
                    stats["splits"]["val"], stats["totals"])
        return w.finish(stats)

    return run_stage(ctx, plan, produce, _record(plan, sources), _summary)
