"""A stage that dies midway leaves no manifest (nothing that looks finished), and the next run completes."""

from __future__ import annotations

from pathlib import Path

import pytest

import codemill.data.corpus as corpus_mod
from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]


def test_ingest_killed_after_half_the_shards(small_corpus, tmp_path, monkeypatch):
    from codemill.flows.pipeline import pipeline

    cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=10)
    cfg.ingest.shard_max_rows = 20
    real_write = corpus_mod.write_parquet_shard
    written: list[Path] = []

    def dies_after_two(df, path):
        if len(written) == 2:
            raise RuntimeError("injected crash after 2 shards")
        real_write(df, path)
        written.append(path)

    monkeypatch.setattr(corpus_mod, "write_parquet_shard", dies_after_two)
    with pytest.raises(RuntimeError, match="injected crash"):
        pipeline(config=cfg)
    assert len(written) == 2
    store_root = Path(cfg.store_root)
    assert not list((store_root / "ingest").rglob("manifest.json")), "a manifest was written for a failed stage"
    # processed chunks are complete units of work, committed one by one: the retry reuses them
    assert list((store_root / "ingest-chunks").glob("*/manifest.json"))
    assert not any(p.exists() for p in written), "half-written shards were left in the store"
    assert not list(store_root.glob("*/.staging-*"))

    monkeypatch.setattr(corpus_mod, "write_parquet_shard", real_write)
    out = pipeline(config=cfg)
    store = ArtifactStore(cfg.store_root)
    assert [st["status"] for st in out["stages"].values()] == ["ran"] * 7
    corpus = ArtifactRef.model_validate(out["stages"]["ingest"]["ref"])
    stats = store.read_manifest(corpus).stats
    assert stats["chunks"]["reused"] == stats["chunks"]["total"] > 0
    assert sum(s["rows"] for s in stats["shards"]["train"] + stats["shards"]["val"]) == stats["files_kept"]
