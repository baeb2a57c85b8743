import json
from pathlib import Path

import pytest

from codemill.store import ArtifactStore, IncompleteArtifactError
from tests.scratch import scratch_plan


def _write(store, plan, payload=b"data", fail=False):
    with store.writer(plan) as w:
        w.path("part/a.bin").write_bytes(payload)
        if fail:
            raise RuntimeError("injected")
        w.finish({"n": 1})


def test_commit_writes_manifest_with_file_hashes(tmp_path):
    store = ArtifactStore(str(tmp_path / "s"))
    plan = scratch_plan("ab")
    ref = store.ref_for(plan)
    assert not store.is_committed(ref)
    _write(store, plan)
    assert store.is_committed(ref)
    m = store.read_manifest(ref)
    assert m.digest == ref.digest and m.files[0].path == "part/a.bin" and m.files[0].bytes == 4
    assert ref.uri.endswith(f"stage/thing-{plan.digest[:12]}")
    assert (m.config, m.inputs, m.code_version) == ({"tag": "ab"}, {}, "t1")  # the manifest states the plan
    assert store.list("stage") == [ref]


def test_failed_write_leaves_nothing(tmp_path):
    store = ArtifactStore(str(tmp_path / "s"))
    plan = scratch_plan("cd")
    ref = store.ref_for(plan)
    with pytest.raises(RuntimeError, match="injected"):
        _write(store, plan, fail=True)
    assert not store.is_committed(ref)
    assert list((tmp_path / "s" / "stage").iterdir()) == []
    with pytest.raises(IncompleteArtifactError):
        store.read_manifest(ref)


def test_writer_without_finish_commits_nothing(tmp_path):
    store = ArtifactStore(str(tmp_path / "s"))
    plan = scratch_plan("ef")
    ref = store.ref_for(plan)
    with pytest.raises(RuntimeError, match="without finish"), store.writer(plan) as w:
        w.path("x").write_text("1")
    assert not store.is_committed(ref)


def test_directory_without_manifest_is_not_committed_and_gets_replaced(tmp_path):
    store = ArtifactStore(str(tmp_path / "s"))
    plan = scratch_plan("12")
    ref = store.ref_for(plan)
    leftover = Path(store._fs_path(ref))
    leftover.mkdir(parents=True)
    (leftover / "junk").write_text("half")
    assert not store.is_committed(ref)
    _write(store, plan)
    assert store.is_committed(ref) and not (leftover / "junk").exists()


def test_second_writer_of_same_digest_keeps_first(tmp_path):
    store = ArtifactStore(str(tmp_path / "s"))
    plan = scratch_plan("34")
    ref = store.ref_for(plan)
    _write(store, plan, b"first")
    _write(store, plan, b"second")
    assert (store.local_path(ref) / "part/a.bin").read_bytes() == b"first"


def test_manifest_digest_mismatch_is_detected(tmp_path):
    store = ArtifactStore(str(tmp_path / "s"))
    plan = scratch_plan("56")
    ref = store.ref_for(plan)
    _write(store, plan)
    mpath = store.local_path(ref) / "manifest.json"
    m = json.loads(mpath.read_text())
    m["digest"] = "00" * 32
    mpath.write_text(json.dumps(m))
    with pytest.raises(IncompleteArtifactError, match="digest"):
        store.read_manifest(ref)


def test_fsspec_memory_store_roundtrip(tmp_path):
    store = ArtifactStore("memory://codemill-test", cache_dir=tmp_path / "cache")
    plan = scratch_plan("78")
    ref = store.ref_for(plan)
    assert ref.uri.startswith("memory://")
    _write(store, plan, b"remote")
    assert store.is_committed(ref)
    assert (store.local_path(ref) / "part/a.bin").read_bytes() == b"remote"
