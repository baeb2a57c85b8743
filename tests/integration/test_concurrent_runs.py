"""Runs that overlap on one store: two pipeline runs started together (the nightly schedule and a run from the
UI) both succeed and build every stage once, the second waiting for the first and reusing what it commits; one
champion is registered. On S3, commits are write-once and claims are leases that one run holds at a time."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from prefect.settings import PREFECT_API_URL

from codemill.lineage import tags as T
from codemill.lineage.read import LineageReader
from codemill.store import ArtifactRef, ArtifactStore
from codemill.store_claim import Claim, ClaimOwner, S3Lease, s3_claim
from tests.integration.helpers import chain_config
from tests.integration.store_checks import committed_artifacts, use_s3
from tests.scratch import scratch_plan

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]
ROOT = Path(__file__).resolve().parents[2]
# The public pipeline flow in its own process; prints what it returns (refs, statuses, run ids, the verdict).
RUN_PIPELINE = r"""
import json, sys
from pathlib import Path
from codemill.config import PipelineConfig
from codemill.flows.pipeline import pipeline
out = pipeline(config=PipelineConfig.model_validate_json(Path(sys.argv[1]).read_text()))
sys.stdout.write("RESULT " + json.dumps(out) + "\n")
"""


def _start_together(config: Path, runs: int) -> list[tuple[int, dict]]:
    """``runs`` pipeline processes on one config, started at once: each one's pid and what its flow returned."""
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "OMP_WAIT_POLICY": "PASSIVE"}  # as the CLI
    procs = [subprocess.Popen([sys.executable, "-c", RUN_PIPELINE, str(config)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(runs)]
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=900)
        assert p.returncode == 0, text[-4000:]
        out.append((p.pid, json.loads(next(line for line in text.splitlines() if line.startswith("RESULT "))[7:])))
    return out


def test_two_pipeline_runs_at_once_build_every_stage_once(tiny_corpus: Path, tmp_path: Path) -> None:
    cfg = chain_config(tiny_corpus, tmp_path)  # one store, one SQLite MLflow for both
    config = tmp_path / "config.json"
    config.write_text(cfg.model_dump_json())
    (pid_a, a), (pid_b, b) = _start_together(config, 2)
    store = ArtifactStore(cfg.store_root)
    committed_artifacts(store)  # every file of every artifact is the one its manifest lists
    assert list(Path(cfg.store_root).glob("*/.staging-*")) == []
    assert a["stages"].keys() == b["stages"].keys()
    refs = {key: ArtifactRef.model_validate(a["stages"][key]["ref"]) for key in a["stages"]}
    assert {k: r.digest for k, r in refs.items()} == {k: v["ref"]["digest"] for k, v in b["stages"].items()}

    # One folder per artifact, and one run built each: the other found it in the store or waited for it.
    for stage in {r.stage for r in refs.values()}:
        folders = sorted(p.name for p in (Path(cfg.store_root) / stage).iterdir() if p.is_dir())
        assert folders == sorted({f"{r.name}-{r.short}" for r in refs.values() if r.stage == stage}), stage
    for key in refs:
        statuses = sorted((a["stages"][key]["status"], b["stages"][key]["status"]))
        assert statuses[1] == "ran" and statuses[0] in ("cached", "present"), (key, statuses)
    waits = [(pid, result["stages"][key]["waited_for"]) for pid, result in ((pid_a, a), (pid_b, b))
             for key in refs if result["stages"][key]["waited_for"]]
    assert waits, "neither run waited for the other: the runs did not overlap"
    for pid, owner in waits:  # the owner record names the other run's process
        assert owner["pid"] == ({pid_a, pid_b} - {pid}).pop() and owner["host"] == socket.gethostname(), owner

    # One MLflow stage run per artifact, one registered version, the champion; the second gate held.
    client = MlflowClient(cfg.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(cfg.name).experiment_id
    for key, ref in refs.items():
        runs = client.search_runs([experiment], f"tags.`{T.OUTPUT_DIGEST}` = '{ref.digest}' and "
                                                f"tags.`{T.STAGE}` = '{ref.stage}'")
        assert [r.info.status for r in runs] == ["FINISHED"], key
        assert T.REREGISTERED not in runs[0].data.tags, key
    versions = client.search_model_versions(f"name = '{cfg.name}'")
    assert len(versions) == 1
    assert client.get_model_version_by_alias(cfg.name, cfg.gate.alias).version == versions[0].version
    assert sorted(r["gate"]["verdict"] for r in (a, b)) == ["hold", "promote"]
    for result in (a, b):
        parent = LineageReader(cfg.mlflow_tracking_uri).run(result["parent_run_id"])
        assert parent is not None and parent.info.status == "FINISHED"
        assert {k: parent.data.tags[T.stage_digest(k)] for k in refs} == {k: r.digest for k, r in refs.items()}


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


FAST_LEASE = {"heartbeat_s": 0.2, "stale_after_s": 1.5, "poll_s": 0.1}  # seconds, so a test sees a lease go stale


def _hold_s3(store: ArtifactStore, run: str, hold_s: float, spans: list[tuple[str, float, float]],
             claims: dict[str, Claim]) -> None:
    """One run's claim on the same S3 key: when it held it (its own clock) and what taking it went through."""
    with s3_claim(store.fs, store.claim_path("stage", "thing-abc"), "stage/thing-abc", run, 30, lambda o: None,
                  **FAST_LEASE) as claim:
        start = time.monotonic()
        time.sleep(hold_s)
        spans.append((run, start, time.monotonic()))
    claims[run] = claim


def _run_all(targets: list[threading.Thread]) -> None:
    for t in targets:
        t.start()
    for t in targets:
        t.join(timeout=60)
        assert not t.is_alive()


def test_s3_claim_waits_for_a_live_holder_however_long_it_holds(s3_endpoint: str, tmp_path: Path, monkeypatch
                                                                ) -> None:
    """A holder's heartbeats keep its lease: a waiter whose staleness bound is shorter than the hold still waits
    (it never takes a live holder's lease), then names the holder it waited for."""
    store = ArtifactStore(use_s3(monkeypatch, s3_endpoint, "codemill-claim-live"), cache_dir=tmp_path / "cache")
    spans: list[tuple[str, float, float]] = []
    claims: dict[str, Claim] = {}
    first = threading.Thread(target=_hold_s3, args=(store, "first", 3 * FAST_LEASE["stale_after_s"], spans, claims))
    first.start()
    deadline = time.monotonic() + 10
    while not store.fs.exists(store.claim_path("stage", "thing-abc")) and time.monotonic() < deadline:
        time.sleep(0.05)
        store.fs.invalidate_cache()
    _run_all([threading.Thread(target=_hold_s3, args=(store, "second", 0.1, spans, claims))])
    first.join()
    assert [run for run, _, _ in spans] == ["first", "second"]
    assert spans[0][2] <= spans[1][1]  # the second held it only after the first let go
    second = claims["second"]
    assert second.took_over is None and second.waited_for is not None and second.waited_for.run == "first"
    store.fs.invalidate_cache()
    assert not store.fs.exists(store.claim_path("stage", "thing-abc"))  # released: the lease object is gone


def test_s3_claim_of_a_dead_holder_is_taken_over_by_one_waiter_at_a_time(s3_endpoint: str, tmp_path: Path,
                                                                        monkeypatch) -> None:
    """The lease a killed run left (no heartbeat any more) goes stale; of three runs waiting for it, exactly one
    takes it over (a conditional write on the ETag they all saw) and names the dead run; the holds never overlap."""
    store = ArtifactStore(use_s3(monkeypatch, s3_endpoint, "codemill-claim-dead"), cache_dir=tmp_path / "cache")
    dead = ClaimOwner(run="run-that-died", pid=4242, host="elsewhere", since=time.time() - 600)
    store.fs.pipe_file(store.claim_path("stage", "thing-abc"), dead.model_dump_json().encode())
    spans: list[tuple[str, float, float]] = []
    claims: dict[str, Claim] = {}
    _run_all([threading.Thread(target=_hold_s3, args=(store, f"waiter-{k}", 0.3, spans, claims)) for k in range(3)])
    spans.sort(key=lambda s: s[1])
    assert all(a[2] <= b[1] for a, b in zip(spans, spans[1:], strict=False)), spans  # one holder at a time
    took = {run: c.took_over.run for run, c in claims.items() if c.took_over is not None}
    assert list(took.values()) == ["run-that-died"], claims
    assert all(claims[run].waited_for is not None for run in claims)  # each waited, for the dead run or a waiter


def test_s3_takeover_is_conditional_on_the_etag_the_waiters_saw(s3_endpoint: str, tmp_path: Path,
                                                                monkeypatch) -> None:
    """Two waiters that judged the same lease stale at the same moment: the first takeover wins, the second finds
    the lease changed and keeps waiting (what keeps a takeover to one run however the waiters' polls line up)."""
    store = ArtifactStore(use_s3(monkeypatch, s3_endpoint, "codemill-claim-etag"), cache_dir=tmp_path / "cache")
    path = store.claim_path("stage", "thing-abc")
    store.fs.pipe_file(path, ClaimOwner(run="run-that-died", pid=4242, host="elsewhere", since=0).model_dump_json()
                       .encode())
    first, second = S3Lease(store.fs, path, "first"), S3Lease(store.fs, path, "second")
    seen = first.read()
    assert seen is not None and seen[1] is not None and seen[1].run == "run-that-died"
    assert first.take_over(seen[0]) is True
    assert second.take_over(seen[0]) is False
    now = second.read()
    assert now is not None and now[1] is not None and now[1].run == "first"


class _Rows:
    """A progress sink that keeps what each stage's row said."""

    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []

    def stage(self, name: str, message: str) -> None:
        self.said.append((name, message))

    def update(self, name: str, done: int, total: int) -> None:
        pass

    def finished(self, name: str, message: str) -> None:
        self.said.append((name, message))


def test_a_gate_waits_for_another_runs_gate_of_the_same_registered_model(tmp_path: Path, mlflow_uri: str) -> None:
    """While another run gates into the registered model, this run's gate waits; it then finds the candidate
    promoted by the other and holds, so the candidate is registered once."""
    from codemill import progress
    from codemill.config import PipelineConfig
    from codemill.flows.evaluate import gate_against_champion, registry_key
    from codemill.flows.plan import plan_evaluations, plan_gate
    from codemill.flows.run import FlowRun
    from codemill.lineage import Registry
    from codemill.tasks.common import RunContext
    from codemill.tasks.resolve_model import ResolvedModel

    cfg = PipelineConfig(name="gated", store_root=str(tmp_path / "store"), work_dir=str(tmp_path / "work"),
                         mlflow_tracking_uri=mlflow_uri)
    ctx = RunContext(store_root=cfg.store_root, work_dir=cfg.work_dir, tracking_uri=mlflow_uri, experiment=cfg.name)
    store, lineage = ctx.store(), ctx.lineage()
    run, gate = FlowRun(store, ctx, lineage, "", None), plan_gate(cfg, plan_evaluations(cfg, store))
    model_id = lineage.client.create_logged_model(lineage.experiment_id, name="candidate").model_id
    candidate = ResolvedModel(ref=store.ref_for(scratch_plan("ab", "train", "model")), hf_dir=str(tmp_path),
                              model_id=model_id)
    rows, verdicts = _Rows(), []
    progress.set_sink(rows)
    try:
        with store.claim("gate", registry_key(cfg.name, mlflow_uri), "other-run", 30):  # the other run gates
            gating = threading.Thread(target=lambda: verdicts.append(
                gate_against_champion(run, gate, candidate, None, {})))
            gating.start()
            deadline = time.monotonic() + 60
            while not any(name == "gate" and "waiting for run 'other-run'" in said for name, said in rows.said):
                assert time.monotonic() < deadline, f"the gate never waited: {rows.said}"
                assert gating.is_alive(), f"the gate ran while another run held its claim: {verdicts}"
                time.sleep(0.05)
            Registry(lineage, cfg.name, cfg.gate.alias).promote(model_id, {})  # the other run's verdict
        gating.join(timeout=120)
    finally:
        progress.set_sink(None)
    assert verdicts and verdicts[0] is not None and verdicts[0]["verdict"] == "hold", verdicts
    assert len(MlflowClient(mlflow_uri).search_model_versions(f"name = '{cfg.name}'")) == 1
