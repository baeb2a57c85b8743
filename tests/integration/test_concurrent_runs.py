"""Two runs started at once on one store: both complete, the store verifies byte by byte, what they committed
is byte-identical to what a run alone commits, and each run's MLflow record names the committed artifacts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from codemill.lineage import tags as T
from codemill.lineage.read import LineageReader
from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config
from tests.integration.store_checks import committed_artifacts, use_s3
from tests.scratch import scratch_plan

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]
ROOT = Path(__file__).resolve().parents[2]
DATA_STAGES = ("ingest", "tokenizer", "tokenize")
# The public pipeline flow up to tokenize, in its own process; prints what it returns (refs, statuses, run ids).
RUN_DATA_STAGES = r"""
import json, sys
from pathlib import Path
from codemill.config import PipelineConfig
from codemill.flows.pipeline import pipeline
out = pipeline(config=PipelineConfig.model_validate_json(Path(sys.argv[1]).read_text()), until="tokenize")
sys.stdout.write("RESULT " + json.dumps(out) + "\n")
"""


def _files(store: ArtifactStore, ref: ArtifactRef) -> dict[str, tuple[int, str]]:
    return {f.path: (f.bytes, f.sha256) for f in store.read_manifest(ref).files}


def test_two_concurrent_runs_on_one_store(small_corpus: Path, tmp_path: Path) -> None:
    from codemill.flows.pipeline import pipeline

    procs, configs = [], []
    for k in range(2):
        cfg = small_pipeline_config(small_corpus, tmp_path)
        cfg.mlflow_tracking_uri = f"sqlite:///{tmp_path / f'mlflow-{k}.db'}"  # the race under test is the store's
        cfg.ingest.chunk_files = 40  # several chunk artifacts, written by both runs at once
        path = tmp_path / f"config-{k}.json"
        path.write_text(cfg.model_dump_json())
        configs.append(cfg)
        env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
        procs.append(subprocess.Popen([sys.executable, "-c", RUN_DATA_STAGES, str(path)], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-4000:]
        results.append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
    store_dir = tmp_path / "store"
    store = ArtifactStore(str(store_dir))
    committed = committed_artifacts(store)  # every file of every artifact is the one its manifest lists
    assert len(committed) >= 4  # corpus, chunks, tokenizer, tokens
    leftovers = list(store_dir.glob("*/.staging-*"))  # neither run left (or deleted the other's) staging
    assert leftovers == []

    # The same data stages run alone, afterwards, on a store of their own: the reference bytes.
    solo_cfg = small_pipeline_config(small_corpus, tmp_path / "solo")
    solo_cfg.ingest.chunk_files = 40
    solo = pipeline(config=solo_cfg, until="tokenize")
    solo_store = ArtifactStore(solo_cfg.store_root)
    for stage in DATA_STAGES:
        solo_ref = ArtifactRef.model_validate(solo["stages"][stage]["ref"])
        for k, result in enumerate(results):
            ref = ArtifactRef.model_validate(result["stages"][stage]["ref"])
            manifest = store.read_manifest(ref)  # committed, under the digest the run reported
            assert manifest.digest == ref.digest == solo_ref.digest, (stage, k)
            assert _files(store, ref) == _files(solo_store, solo_ref), f"{stage}: run {k} committed other bytes"
    assert len(list((store_dir / "ingest-chunks").glob("*/manifest.json"))) > 1  # several chunks were raced for

    # Each run's own MLflow has a finished stage run for every committed artifact (whichever run wrote it),
    # the run id the flow returned is that run, and the parent run names the same digests.
    for k, (cfg, result) in enumerate(zip(configs, results, strict=True)):
        reader = LineageReader(cfg.mlflow_tracking_uri)
        parent = reader.run(result["parent_run_id"])
        assert parent is not None and parent.info.status == "FINISHED", k
        for stage in DATA_STAGES:
            digest = result["stages"][stage]["ref"]["digest"]
            assert parent.data.tags[T.stage_digest(stage)] == digest, (stage, k)
            found = reader.stage_run(reader.experiment_ids(), stage, digest)
            assert found is not None, f"run {k} ({result['stages'][stage]['status']}): no {stage} run in its MLflow"
            assert found.info.status == "FINISHED", (stage, k)
            assert reader.run(result["stages"][stage]["run_id"]) is not None, (stage, k, "run id of another DB")


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
