"""Processes die with their launcher (lifeline pipe, parent-death signal); one trainer per checkpoint directory.

Real processes throughout: a "launcher" runs ``run_streaming`` on a "torchrun" stand-in that starts a "rank" in
its own session, as torchrun does, so only the rank's own ties can end it when the launcher is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from codemill.models.checkpoint import CheckpointDirBusy, lock_dir
from codemill.models.lifeline import parent_of

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux")

RANK = ("import os, time; from codemill.models import lifeline; {arm}; print(os.getpid(), os.getppid(), flush=True); "
        "time.sleep(120)")
# like torchrun, it outlives its rank (torchrun cleans up, or restarts workers, for a while)
TORCHRUN = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
            "start_new_session=True).wait(); time.sleep(120)")
LAUNCHER = textwrap.dedent("""
    import os, sys
    from codemill.models.launch import run_streaming
    run_streaming([sys.executable, "-c", sys.argv[1], sys.argv[2]], dict(os.environ), 120,
                  on_line=lambda line: print(line, flush=True))
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _launch_rank(arm: str) -> tuple[subprocess.Popen, int, int]:
    """launcher -> torchrun stand-in -> rank (own session); returns the launcher and the rank's and stand-in's pids."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, TORCHRUN, RANK.format(arm=arm)],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert launcher.stdout is not None
    rank, torchrun = map(int, launcher.stdout.readline().split())
    assert parent_of(torchrun) == launcher.pid
    return launcher, rank, torchrun


def test_rank_and_torchrun_die_when_the_launcher_is_sigkilled():
    """The lifeline alone: the torchrun stand-in has no ties of its own and the rank's parent lives on."""
    launcher, rank, torchrun = _launch_rank("lifeline.arm()")
    try:
        assert _alive(rank)
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher's group only: the others have their own sessions
        launcher.wait()
        assert _gone_within(rank, 3), "the rank outlived its launcher"
        assert _gone_within(torchrun, 3), "torchrun outlived its launcher"
    finally:
        for pid in (rank, torchrun):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_unarmed_rank_outlives_its_launcher():
    """The control: without the lifeline nothing ends the rank (what the test above guards against)."""
    launcher, rank, torchrun = _launch_rank("None")
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        assert not _gone_within(rank, 1.5)
    finally:
        os.kill(rank, signal.SIGKILL)
        os.kill(torchrun, signal.SIGKILL)


def test_rank_dies_with_its_parent():
    """Parent-death signal: the torchrun stand-in is SIGKILLed while the launcher (this test) lives on."""
    torchrun = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys
        rank = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True, stdout=subprocess.PIPE,
                                text=True)
        print(rank.stdout.readline().strip(), flush=True)
        rank.wait()
    """), RANK.format(arm="lifeline.die_with_parent()")], stdout=subprocess.PIPE, text=True)
    assert torchrun.stdout is not None
    rank = int(torchrun.stdout.readline().split()[0])
    try:
        assert parent_of(rank) == torchrun.pid
        torchrun.kill()
        torchrun.wait()
        assert _gone_within(rank, 3), "the rank outlived its parent"
    finally:
        if _alive(rank):
            os.kill(rank, signal.SIGKILL)


def test_checkpoint_dir_admits_one_trainer(tmp_path):
    fd = lock_dir(tmp_path / "ckpt")
    with pytest.raises(CheckpointDirBusy, match=rf"in use by another trainer \(pid {os.getpid()} on "):
        lock_dir(tmp_path / "ckpt")
    os.close(fd)
    os.close(lock_dir(tmp_path / "ckpt"))  # free again once the holder lets go


def test_checkpoint_dir_lock_dies_with_its_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from codemill.models.checkpoint import lock_dir; lock_dir(Path(sys.argv[1])); "
                               "print('held', flush=True); time.sleep(120)", str(tmp_path / "ckpt")],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(CheckpointDirBusy, match=rf"pid {holder.pid} on "):
        lock_dir(tmp_path / "ckpt")
    holder.kill()
    holder.wait()
    os.close(lock_dir(tmp_path / "ckpt"))
