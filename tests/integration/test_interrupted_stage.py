"""A stage that dies midway leaves no manifest (nothing that looks finished), and the next run completes: once
by a Python exception (the writer's cleanup runs) and once by SIGKILL of the process writing the shards (no
cleanup runs at all)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL
from typer.testing import CliRunner

import codemill.data.corpus as corpus_mod
from codemill.cli import app
from codemill.store import MANIFEST, ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config
from tests.integration.store_checks import committed_artifacts

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]
ROOT = Path(__file__).resolve().parents[2]

# The real ingest stage in its own process, each shard written for real and then followed by a pause, so the
# test can SIGKILL it between shards: after some of the artifact's payload is on disk, before its commit.
SLOW_INGEST = r"""
import sys, time
from pathlib import Path
import codemill.data.corpus as corpus
from codemill.config import PipelineConfig
from codemill.flows.pipeline import pipeline
real_write = corpus.write_parquet_shard
def write_then_pause(df, path):
    real_write(df, path)
    sys.stdout.write(f"SHARD {path}\n")  # not print: the flow's log_prints would route it to the logger
    sys.stdout.flush()
    time.sleep(0.5)
corpus.write_parquet_shard = write_then_pause
pipeline(config=PipelineConfig.model_validate_json(Path(sys.argv[1]).read_text()), until="ingest")
"""


def test_ingest_killed_after_half_the_shards(small_corpus, tmp_path, monkeypatch):
    from codemill.flows.pipeline import pipeline

    cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=10)
    cfg.ingest.shard_max_rows = 20
    real_write = corpus_mod.write_parquet_shard
    written: list[Path] = []
    calls = itertools.count()  # shards may be written on two threads: next() on a count is atomic

    def dies_after_two(df, path):
        if next(calls) >= 2:
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


def _ingest_plan(config_path: Path) -> dict:
    """``codemill plan``'s ingest row: is the artifact in the store (a committed manifest) or would it run?"""
    res = CliRunner().invoke(app, ["plan", "--config", str(config_path), "--until", "ingest", "--json"])
    assert res.exit_code == 0, res.output
    (row,) = [r for r in json.loads(res.output) if r["step"] == "ingest"]
    return row


def test_ingest_sigkilled_while_writing_shards(small_corpus, tmp_path):
    from codemill.flows.pipeline import pipeline

    cfg = small_pipeline_config(small_corpus, tmp_path)
    cfg.ingest.shard_max_rows = 20  # many shards, so the kill lands with some written and more to come
    config_path = tmp_path / "config.json"
    config_path.write_text(cfg.model_dump_json())
    ingest_dir = Path(cfg.store_root) / "ingest"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_INGEST, str(config_path)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    shards, tail = [], []
    for line in proc.stdout:
        tail.append(line)
        if line.startswith("SHARD ") and Path(line[6:].strip()).is_relative_to(ingest_dir):
            shards.append(Path(line[6:].strip()))
            if len(shards) == 2:
                os.killpg(proc.pid, signal.SIGKILL)  # the flow process and anything it started; no cleanup
                break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(tail[-40:])

    partial = shards[0].parent.parent  # the folder the killed run was filling: its payload is still there
    assert all(p.is_file() for p in shards)
    assert not (partial / MANIFEST).exists()
    store = ArtifactStore(cfg.store_root)
    assert store.list("ingest") == [] and not list(ingest_dir.glob(f"*/{MANIFEST}"))
    # nothing that looks finished: no folder at an artifact's own path, only hidden staging (and lock files)
    assert [p.name for p in ingest_dir.iterdir() if not p.name.startswith(".")] == []
    before = _ingest_plan(config_path)
    assert before["action"] == "run", before  # the planner does not take the partial payload as the artifact

    out = pipeline(config=cfg, until="ingest")
    assert out["stages"]["ingest"]["status"] == "ran"
    ref = ArtifactRef.model_validate(out["stages"]["ingest"]["ref"])
    assert ref.digest == before["digest"]
    assert _ingest_plan(config_path)["action"] == "skip (in store)"
    manifests = committed_artifacts(store, allow_uncommitted=True)  # the killed run's staging has no manifest
    corpus = manifests[f"ingest/{ref.name}"]
    assert corpus.digest == ref.digest
    stats = corpus.stats
    assert sum(s["rows"] for s in stats["shards"]["train"] + stats["shards"]["val"]) == stats["files_kept"]
    assert len(stats["shards"]["train"]) > 2  # the run that was killed had more shards to write
