"""A nightly re-ingest: only changed chunks are redone, and the new manifest says what changed (real MLflow)."""

from __future__ import annotations

import shutil

import pytest

from codemill.data.config import IngestConfig
from codemill.data.sources import FolderSource
from codemill.tasks.common import RunContext

pytestmark = pytest.mark.integration


def _ingest(cfg, ctx):
    from prefect.logging import disable_run_logger

    from codemill.tasks.ingest import fingerprint_sources_task, ingest_task, plan_ingest

    with disable_run_logger():
        sources = fingerprint_sources_task.fn(cfg)
        return ingest_task.fn(plan=plan_ingest(cfg, sources), ctx=ctx, cfg=cfg, sources=sources)


def test_reingest_reuses_unchanged_chunks_and_reports_changes(small_corpus, tmp_path, mlflow_uri):
    import mlflow

    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    ctx = RunContext(store_root=str(tmp_path / "store"), work_dir=str(tmp_path / "work"), tracking_uri=mlflow_uri,
                     experiment="incremental")
    cfg = IngestConfig(sources=[FolderSource(path=str(corpus))], chunk_files=16)
    first = _ingest(cfg, ctx)
    m1 = ctx.store().read_manifest(first.ref)
    assert m1.stats["changes"] == {"previous": None} and m1.stats["chunks"]["reused"] == 0
    (corpus / "json" / "decoder.py").write_text((corpus / "json" / "decoder.py").read_text() + "\nEXTRA = 1\n")
    (corpus / "json" / "brand_new.py").write_text("def brand_new():\n    return 'new'\n")
    (corpus / "textwrap.py").unlink()
    second = _ingest(cfg, ctx)
    assert second.ref.digest != first.ref.digest
    st = ctx.store().read_manifest(second.ref).stats
    ch = st["changes"]
    assert ch["previous"] == first.ref.digest
    assert (ch["added"], ch["removed"], ch["modified"]) == (1, 1, 1)
    assert ch["unchanged"] == m1.stats["files_seen"] - 2
    total, reused = st["chunks"]["total"], st["chunks"]["reused"]
    assert total > 10 and total - reused <= 6, st["chunks"]  # at most two chunks per changed file
    changes = {e["path"]: e["change"] for e in ch["examples"]}
    assert changes == {"json/brand_new.py": "added", "textwrap.py": "removed", "json/decoder.py": "modified"}
    # the counts by reason are an MLflow table on the ingest run
    import json

    client = mlflow.MlflowClient(mlflow_uri)
    local = client.download_artifacts(second.run_id, "ingest_counts.json", str(tmp_path))
    with open(local) as fh:
        table = json.load(fh)
    steps = {row[table["columns"].index("step")] for row in table["data"]}
    assert steps >= {"read", "filter", "exact_dedup"}
    assert client.get_run(second.run_id).data.metrics["files_kept"] == st["files_kept"]
