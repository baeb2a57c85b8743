"""Prefect tasks of the ingest stage."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from codemill import progress
from codemill.config import IngestConfig
from codemill.data.ingest import INGEST_CODE_VERSION, fingerprint_sources, run_ingest
from codemill.hashing import stage_digest
from codemill.lineage import Lineage
from codemill.store import ArtifactRef, ArtifactStore, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, artifact_cache_key, run_stage

STAGE = "ingest"


def plan_ingest(store: ArtifactStore, cfg: IngestConfig, sources: list[dict]) -> ArtifactRef:
    inputs = {f"source.{i}.{s['repo']}": s["fingerprint"] for i, s in enumerate(sources)}
    return store.ref(STAGE, "corpus", stage_digest(STAGE, INGEST_CODE_VERSION, cfg.digest_config(), inputs))


@task(name="fingerprint-sources")
def fingerprint_sources_task(cfg: IngestConfig) -> list[dict]:
    """Content fingerprint of every source (always runs: it is how a changed corpus is noticed)."""
    progress.sink().stage(STAGE, "fingerprinting sources")
    return fingerprint_sources(cfg)


def _summary(m: Manifest) -> dict[str, Any]:
    return {"files": m.stats["files_kept"], "bytes": m.stats["bytes_kept"],
            "rejected": m.stats["rejected_by_reason"], "splits": m.stats["splits"]}


def _record(sources: list[dict]):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        tags: dict[str, Any] = {}
        for i, s in enumerate(sources):
            tags |= {f"codemill.source.{i}.root": s["root"], f"codemill.source.{i}.repo": s["repo"],
                     f"codemill.source.{i}.fingerprint": s["fingerprint"],
                     f"codemill.source.{i}.commit": s.get("commit") or "none"}
        lineage.tag(run_id, tags)
        lineage.log_params(run_id, {"ingest": m.config})
        st = m.stats
        metrics = {"files_seen": st["files_seen"], "files_kept": st["files_kept"], "bytes_kept": st["bytes_kept"],
                   **{f"rejected.{k}": v for k, v in st["rejected_by_reason"].items()},
                   **{f"{split}.files": v["files"] for split, v in st["splits"].items()}}
        lineage.log_metrics(run_id, metrics)
        lineage.log_json(run_id, m.model_dump(mode="json"), "manifest.json")
        return {}
    return record


@task(name="ingest", cache_key_fn=artifact_cache_key, persist_result=True, cache_result_in_memory=False)
def ingest_task(ref: ArtifactRef, ctx: RunContext, cfg: IngestConfig, sources: list[dict]) -> StageResult:
    logger = get_run_logger()

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        stats = run_ingest(cfg, w.dir, progress=lambda msg: progress.sink().stage(STAGE, msg))
        stats["source_fingerprints"] = sources
        logger.info("ingest: kept %d of %d files (%s bytes); rejected %s", stats["files_kept"],
                    stats["files_seen"], stats["bytes_kept"], stats["rejected_by_reason"])
        return w.finish(code_version=INGEST_CODE_VERSION, config=cfg.digest_config(), stats=stats)

    return run_stage(ctx, ref, produce, _record(sources), _summary)
