"""Build claims on a local store: a second run waits for the holder and learns who it is; a holder that dies
(SIGKILL, no cleanup) frees the claim at once and is named; a wedged holder is waited for a bounded time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from codemill.store import ArtifactStore
from codemill.store_claim import ClaimOwner, ClaimWaitTimeout
from tests.scratch import scratch_plan

ROOT = Path(__file__).resolve().parents[2]
# Takes the claim of scratch_plan("ab") in a store, says so, and sleeps holding it until it is killed.
HOLD = r"""
import sys, time
from codemill.store import ArtifactStore
from tests.scratch import scratch_plan
store = ArtifactStore(sys.argv[1])
with store.claim_artifact(store.ref_for(scratch_plan("ab")), "run-that-dies", 5):
    print("held", flush=True)
    time.sleep(600)
"""


def _store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(str(tmp_path / "store"))


def test_a_second_claim_waits_for_the_holder_and_names_it(tmp_path: Path) -> None:
    store = _store(tmp_path)
    ref = store.ref_for(scratch_plan("ab"))
    events: list[str] = []
    seen: list[ClaimOwner] = []
    held = threading.Event()

    def holder() -> None:
        with store.claim_artifact(ref, "first-run", 5):
            held.set()
            time.sleep(0.6)
            events.append("first released")

    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    with store.claim_artifact(ref, "second-run", 5, on_wait=seen.append) as claim:
        events.append("second holds")
    t.join()
    assert events == ["first released", "second holds"]
    assert [(o.run, o.pid) for o in seen] == [("first-run", os.getpid())]  # reported once, from the owner record
    assert claim.waited_for is not None and claim.waited_for.run == "first-run"
    assert claim.waited_s > 0.3
    assert claim.took_over is None  # released normally: nothing was taken over
    assert "first-run" in claim.waited_for.describe() and f"pid {os.getpid()}" in claim.waited_for.describe()


def test_a_free_claim_waits_for_nobody(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with store.claim_artifact(store.ref_for(scratch_plan("ab")), "only-run", 5) as claim:
        assert claim.waited_for is None and claim.took_over is None and claim.waited_s == 0.0
    claims = [p.name for p in (tmp_path / "store" / "stage").iterdir()]
    assert claims == [f".thing-{scratch_plan('ab').digest[:12]}.claim"]  # a hidden file, never an artifact folder


def test_a_holder_killed_without_cleanup_frees_the_claim_and_is_named(tmp_path: Path) -> None:
    store = _store(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, store.root_url], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        seen: list[ClaimOwner] = []
        took: list[ClaimOwner | None] = []

        def waiter() -> None:
            with store.claim_artifact(store.ref_for(scratch_plan("ab")), "survivor", 30, on_wait=seen.append) as c:
                took.append(c.took_over)

        t = threading.Thread(target=waiter)
        t.start()
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(o.run, o.pid) for o in seen] == [("run-that-dies", proc.pid)]  # it waits for the live holder
        os.kill(proc.pid, signal.SIGKILL)
        t.join(timeout=10)
        assert not t.is_alive(), "the claim of a killed holder was not freed"
    finally:
        proc.kill()
        proc.wait()
    assert took and took[0] is not None and (took[0].run, took[0].pid) == ("run-that-dies", proc.pid)


def test_waiting_is_bounded_and_the_error_names_the_holder(tmp_path: Path) -> None:
    store = _store(tmp_path)
    ref = store.ref_for(scratch_plan("ab"))
    with store.claim_artifact(ref, "wedged-run", 5):
        t0 = time.monotonic()
        with pytest.raises(ClaimWaitTimeout) as failed, store.claim_artifact(ref, "second-run", 0.5):
            pass
        assert time.monotonic() - t0 < 5
    message = str(failed.value)
    assert f"stage/thing-{ref.short}" in message and "'wedged-run'" in message and f"pid {os.getpid()}" in message
    with store.claim_artifact(ref, "third-run", 0.5) as claim:  # the timed-out waiter left the claim alone
        assert claim.took_over is None
