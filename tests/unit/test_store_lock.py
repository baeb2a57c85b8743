"""Concurrent commits of the same artifact: every writer succeeds and the committed copy stays whole."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from codemill.hashing import sha256_file
from codemill.store import MANIFEST, ArtifactStore, artifact_lock
from tests.scratch import scratch_plan

WRITERS = 8


def _commit_once(store: ArtifactStore, barrier: threading.Barrier, n: int, errors: list[BaseException]) -> None:
    plan = scratch_plan("ab")
    try:
        with store.writer(plan) as w:
            w.path("payload.bin").write_bytes(b"x" * 100_000 + bytes([n]))
            w.finish()
            barrier.wait()  # all writers commit at the same moment
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


def test_threads_committing_the_same_ref_all_succeed_and_the_store_verifies(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    for _ in range(5):  # repeat: the unlocked check-rmtree-rename race needs a few tries to show
        barrier, errors = threading.Barrier(WRITERS), []
        threads = [threading.Thread(target=_commit_once, args=(store, barrier, n, errors)) for n in range(WRITERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        plan = scratch_plan("ab")
        ref = store.ref_for(plan)
        manifest = store.read_manifest(ref)
        root = store.local_path(ref)
        for entry in manifest.files:
            assert sha256_file(root / entry.path) == entry.sha256
        assert [p.name for p in (tmp_path / "store" / "stage").iterdir() if not p.name.startswith(".")] == \
            [root.name]
        assert not [p for p in (tmp_path / "store" / "stage").iterdir() if p.name.startswith(".staging")]
        (root / MANIFEST).unlink()  # next round starts from an incomplete leftover, the hardest case


def test_artifact_lock_is_exclusive_across_threads(tmp_path: Path) -> None:
    target = tmp_path / "stage" / "thing-abc"
    events: list[str] = []
    held = threading.Event()

    def holder() -> None:
        with artifact_lock(target):
            held.set()
            time.sleep(0.3)
            events.append("holder-release")

    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    with artifact_lock(target):
        events.append("second-acquire")
    t.join()
    assert events == ["holder-release", "second-acquire"]


def test_commit_waits_for_the_lock_and_keeps_the_first_writers_artifact(tmp_path: Path) -> None:
    """The interleaving that lost artifacts without a lock: writer B checks 'no manifest' while writer A is
    mid-commit, then deletes A's freshly renamed directory as 'incomplete'. With the lock B waits, then sees
    A's manifest and leaves it alone."""
    store = ArtifactStore(str(tmp_path / "store"))
    plan = scratch_plan("cd")
    ref = store.ref_for(plan)
    target = Path(store._fs_path(ref))
    target.mkdir(parents=True)  # an incomplete leftover from a crashed run
    done = threading.Event()

    def writer_b() -> None:
        with store.writer(plan) as w:
            w.path("payload.bin").write_bytes(b"from B")
            w.finish()
        done.set()

    with artifact_lock(target):  # writer A is committing
        t = threading.Thread(target=writer_b)
        t.start()
        assert not done.wait(0.5)  # B blocks on the lock instead of racing A
        staging = tmp_path / "a-staging"
        with store.writer(scratch_plan("ef", "scratch", "a")) as w:  # a real finished payload for A
            w.path("payload.bin").write_bytes(b"from A")
            a_manifest = w.finish()
        src = Path(store._fs_path(store.ref_for(scratch_plan("ef", "scratch", "a"))))
        src.rename(staging)
        (staging / MANIFEST).write_text(a_manifest.model_copy(update={"digest": ref.digest}).model_dump_json())
        target.rmdir()
        staging.rename(target)
    t.join(timeout=10)
    assert done.is_set()
    assert (target / "payload.bin").read_bytes() == b"from A"  # B saw A's commit and kept it
    assert store.read_manifest(ref).digest == ref.digest
