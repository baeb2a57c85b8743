"""Prefect tasks of the ingest stage."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import polars as pl
from prefect import get_run_logger, task

from codemill import metrics, progress
from codemill.data.config import IngestConfig
from codemill.data.ingest import CHUNK_CODE_VERSION, INGEST_CODE_VERSION, diff_ledgers, fingerprint_sources, run_ingest
from codemill.hashing import digest_of
from codemill.lineage import Lineage
from codemill.lineage import tags as T
from codemill.plan import StagePlan, external_input
from codemill.store import ArtifactRef, ArtifactStore, ArtifactWriter, Manifest
from codemill.tasks import fanout
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task

STAGE = "ingest"
CHUNK_STAGE = "ingest-chunks"
LEDGER_FILE = "files.parquet"


@dataclass(frozen=True)
class StoreChunkCache:
    """Processed chunks as small committed artifacts in the store: shared by runs, workers and machines."""

    store_root: str
    cache_dir: str

    def _store(self) -> ArtifactStore:
        return ArtifactStore(self.store_root, cache_dir=self.cache_dir)

    def load(self, key: str) -> pl.DataFrame | None:
        store = self._store()
        ref = store.ref_for(chunk_plan(key))
        if not store.is_committed(ref):
            return None
        with store.open_file(ref, "rows.parquet") as fh:
            return pl.read_parquet(io.BytesIO(fh.read()))

    def save(self, key: str, df: pl.DataFrame) -> None:
        with self._store().writer(chunk_plan(key)) as w:
            df.write_parquet(w.path("rows.parquet"), compression="zstd")
            w.finish(stats={"rows": df.height})


def chunk_plan(key: str) -> StagePlan:
    """A processed chunk is addressed by its content key (its rows' paths and hashes and the processing
    config, computed by ``data.ingest``), hashed like any other artifact."""
    return StagePlan(stage=CHUNK_STAGE, name="chunk", code_version=CHUNK_CODE_VERSION, config={"chunk_key": key})


def source_key(sources: list[dict]) -> str:
    """Which sources a corpus came from (not their content): how a re-ingest finds its predecessor."""
    return digest_of([[s.get("kind", "folder"), s["root"], s["repo"]] for s in sources])


def plan_ingest(cfg: IngestConfig, sources: list[dict]) -> StagePlan:
    """The corpus depends on the ingest config and on each source's content fingerprint."""
    inputs = {f"source.{i}.{s['repo']}": external_input("source", s["repo"], s["fingerprint"], s["root"])
              for i, s in enumerate(sources)}
    return StagePlan(stage=STAGE, name="corpus", code_version=INGEST_CODE_VERSION, config=cfg.digest_config(),
                     inputs=inputs)


@task(name="fingerprint-sources", retries=2, retry_delay_seconds=5)
def fingerprint_sources_task(cfg: IngestConfig) -> list[dict]:
    """Content fingerprint of every source (always runs: it is how a changed corpus is noticed)."""
    progress.sink().stage(STAGE, "fingerprinting sources")
    return fingerprint_sources(cfg)


def previous_corpus(store: ArtifactStore, key: str, exclude_digest: str) -> tuple[ArtifactRef, Manifest] | None:
    """The newest committed corpus built from the same sources, if any."""
    best = None
    for ref in store.list(STAGE):
        if ref.digest == exclude_digest:
            continue
        m = store.read_manifest(ref)
        if m.stats.get("source_key") == key and (best is None or m.created_at > best[1].created_at):
            best = (ref, m)
    return best


def changes_since_previous(store: ArtifactStore, key: str, ref: ArtifactRef, w: ArtifactWriter) -> dict[str, Any]:
    prev = previous_corpus(store, key, ref.digest)
    if prev is None:
        return {"previous": None}
    with store.open_file(prev[0], LEDGER_FILE) as fh:
        old = pl.read_parquet(io.BytesIO(fh.read()))
    counts, changed = diff_ledgers(old, pl.read_parquet(w.path(LEDGER_FILE)))
    changed.write_parquet(w.path("changes.parquet"))
    return {"previous": prev[0].digest, "previous_uri": prev[0].uri, **counts,
            "examples": changed.head(50).select("repo", "path", "change").to_dicts()}


def _summary(m: Manifest) -> dict[str, Any]:
    return {"files": m.stats["files_kept"], "bytes": m.stats["bytes_kept"],
            "rejected": m.stats["rejected_by_reason"], "splits": m.stats["splits"],
            "chunks": m.stats.get("chunks"), "changes": {k: v for k, v in m.stats.get("changes", {}).items()
                                                         if k in ("added", "removed", "modified", "unchanged")}}


def _record(sources: list[dict]):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        tags: dict[str, Any] = {}
        for i, s in enumerate(sources):
            fields = {"root": s["root"], "repo": s["repo"], "kind": s.get("kind", "folder"),
                      "fingerprint": s["fingerprint"], "commit": s.get("commit") or "none"}
            tags |= {T.source(i, k): v for k, v in fields.items()}
        lineage.tag(run_id, tags)
        st = m.stats
        metrics = {"files_seen": st["files_seen"], "files_kept": st["files_kept"], "bytes_kept": st["bytes_kept"],
                   **{f"rejected.{k}": v for k, v in st["rejected_by_reason"].items()},
                   **{f"redacted.{k}": v for k, v in st.get("redactions", {}).items()},
                   **{f"{split}.files": v["files"] for split, v in st["splits"].items()}}
        lineage.log_metrics(run_id, metrics)
        lineage.log_table(run_id, st.get("steps", []), "ingest_counts.json")
        lineage.log_table(run_id, [{"type": k, "count": v} for k, v in st.get("redactions", {}).items()],
                          "redaction_counts.json")
        return {}
    return record


def count_ingest(stats: dict[str, Any]) -> None:
    """An ingest run's counts in the metrics: files and bytes read, rejections by reason, chunks reused."""
    m = metrics.get()
    m.ingest_files.labels("kept").inc(stats["files_kept"])
    m.ingest_files.labels("rejected").inc(stats["files_seen"] - stats["files_kept"])
    m.ingest_bytes.inc(stats["bytes_seen"])
    for reason, files in stats["rejected_by_reason"].items():
        m.ingest_rejected_files.labels(reason).inc(files)
    m.ingest_chunks.labels("reused").inc(stats["chunks"]["reused"])
    m.ingest_chunks.labels("processed").inc(stats["chunks"]["total"] - stats["chunks"]["reused"])


@stage_task("ingest")
def ingest_task(plan: StagePlan, ctx: RunContext, cfg: IngestConfig, sources: list[dict]) -> StageResult:
    logger = get_run_logger()
    store = ctx.store()
    cache = StoreChunkCache(ctx.store_root, str(store.cache_dir))

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        # on Ray, chunks fan out as Prefect tasks; otherwise run_ingest's own threads use this machine's CPUs
        stats = run_ingest(cfg, w.dir, cache=cache, progress=lambda msg: progress.sink().stage(STAGE, msg),
                           mapper=fanout.mapper if fanout.on_ray() else None)
        stats["source_fingerprints"] = sources
        stats["source_key"] = source_key(sources)
        stats["changes"] = changes_since_previous(store, stats["source_key"], w.ref, w)
        count_ingest(stats)
        logger.info("ingest: kept %d of %d files (%s bytes); rejected %s; chunks reused %s; changes %s",
                    stats["files_kept"], stats["files_seen"], stats["bytes_kept"], stats["rejected_by_reason"],
                    stats["chunks"], {k: v for k, v in stats["changes"].items() if k != "examples"})
        return w.finish(stats)

    return run_stage(ctx, plan, produce, _record(sources), _summary)
