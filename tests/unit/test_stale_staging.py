"""Staging left by dead writers is swept when a writer opens; a live writer's staging never is, in this process
or another."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from codemill.store import ArtifactStore, sweep_stale_staging
from tests.scratch import scratch_plan

HOLDER = textwrap.dedent("""
    import sys, time
    from codemill.store import ArtifactStore
    from tests.scratch import scratch_plan
    with ArtifactStore(sys.argv[1]).writer(scratch_plan("theirs")) as w:
        (w.dir.parent / f"{w.dir.name}.spec.json").write_text("{}")
        print(w.dir, flush=True)
        time.sleep(120)
""")
ROOT = Path(__file__).resolve().parents[2]


def _other_writer(store: Path) -> tuple[subprocess.Popen, Path]:
    """A writer in another process, inside its ``with`` (staging open, a sidecar next to it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(store)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_dead_writers_staging_and_sidecar_go_a_live_ones_stay(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    live, live_dir = _other_writer(tmp_path / "store")
    dead, dead_dir = _other_writer(tmp_path / "store")
    try:
        dead.send_signal(signal.SIGKILL)  # no finally runs: its staging and sidecar stay behind
        dead.wait()
        orphan = live_dir.parent / ".staging-thing-0123456789ab-gone.spec.json"  # a sidecar with no directory
        orphan.write_text("{}")
        assert dead_dir.is_dir() and Path(f"{dead_dir}.spec.json").exists()
        with store.writer(scratch_plan("mine")) as w:
            mine = w.dir
            # a second writer of the same stage, in this process, while the first is open
            with store.writer(scratch_plan("mine-too")) as w2:
                w2.path("x").write_text("x")
                w2.finish()
            assert mine.is_dir()
            w.path("x").write_text("x")
            w.finish()
        assert not dead_dir.exists() and not Path(f"{dead_dir}.spec.json").exists() and not orphan.exists()
        assert live_dir.is_dir() and Path(f"{live_dir}.spec.json").exists()
    finally:
        live.kill()
        live.wait()
    assert [p.name for p in sweep_stale_staging(live_dir.parent, ".staging-")] == sorted(
        [live_dir.name, f"{live_dir.name}.spec.json"])  # stale now that its writer is dead
    assert sorted(p.name for p in live_dir.parent.iterdir() if not p.name.endswith(".lock")) == sorted(
        [f"thing-{store.ref_for(scratch_plan(t)).short}" for t in ("mine", "mine-too")])


def test_remote_store_staging_in_the_cache_is_swept_too(tmp_path):
    cache = tmp_path / "cache"
    stale = cache / "staging-thing-0123456789ab-dead"
    stale.mkdir(parents=True)
    (stale / "part.bin").write_bytes(b"x")
    store = ArtifactStore(f"memory://{tmp_path.name}/store", cache_dir=cache)
    with store.writer(scratch_plan("a")) as w:
        assert w.dir.parent == cache and w.dir.is_dir()
        assert not stale.exists()
        w.path("x").write_text("x")
        w.finish()
    assert not w.dir.exists()
    assert os.listdir(cache) == []
