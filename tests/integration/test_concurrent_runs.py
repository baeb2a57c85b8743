"""Two runs started at once on one store: both complete, the store verifies, and they agree on every digest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from codemill.store import ArtifactStore
from tests.integration.helpers import small_pipeline_config
from tests.integration.store_checks import committed_artifacts, use_s3
from tests.scratch import scratch_plan

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]
ROOT = Path(__file__).resolve().parents[2]


def test_two_concurrent_runs_on_one_store(small_corpus: Path, tmp_path: Path) -> None:
    procs = []
    for k in range(2):
        cfg = small_pipeline_config(small_corpus, tmp_path)
        cfg.mlflow_tracking_uri = f"sqlite:///{tmp_path / f'mlflow-{k}.db'}"  # the race under test is the store's
        cfg.ingest.chunk_files = 40  # several chunk artifacts, written by both runs at once
        path = tmp_path / f"config-{k}.json"
        path.write_text(cfg.model_dump_json())
        env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.integration.stage_flows", str(path)], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-4000:]
        results.append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
    assert results[0] == results[1]
    store = tmp_path / "store"
    assert len(committed_artifacts(ArtifactStore(str(store)))) >= 4  # corpus, chunks, tokenizer, tokens
    leftovers = list(store.glob("*/.staging-*"))  # neither run left (or deleted the other's) staging
    assert leftovers == []


def test_s3_commits_are_write_once(s3_endpoint: str, tmp_path: Path, monkeypatch) -> None:
    """No lock on S3: the first manifest wins, a later writer of the same digest leaves it (and its payload)
    alone, and an upload in progress (files, no manifest yet) is never deleted by another writer."""
    store = ArtifactStore(use_s3(monkeypatch, s3_endpoint, "codemill-once"), cache_dir=tmp_path / "cache")
    plan = scratch_plan("ab")
    ref = store.ref_for(plan)
    with store.fs.open(f"{ref.uri}/other-run-uploading.bin", "wb") as fh:  # another run mid-upload
        fh.write(b"theirs")
    with store.writer(plan) as a, store.writer(plan) as b:  # two runs build the same artifact at once
        a.path("payload.bin").write_bytes(b"A")
        b.path("payload.bin").write_bytes(b"A")
        a.finish({"writer": "a"})
        b.finish({"writer": "b"})
        store.fs.invalidate_cache()
    # b exits (commits) first here, being the inner context; a then finds it committed and keeps b's manifest
    kept = store.read_manifest(ref)
    assert kept.stats == {"writer": "b"}
    assert store.fs.cat(f"{ref.uri}/other-run-uploading.bin") == b"theirs"
    assert store.fs.cat(f"{ref.uri}/payload.bin") == b"A"
