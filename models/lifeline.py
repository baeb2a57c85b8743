"""Trainer ranks die with the process that launched them: no orphan keeps training after its launcher is gone.

The chain is launcher (the train task, in the flow process) -> torchrun -> ranks, and each link runs in its own
session (the launcher starts torchrun with ``start_new_session`` so it can kill its group on a timeout;
torchrun starts every rank in a new session too), so a kill of the flow's process group reaches neither. Two
ties, both armed by the rank itself at startup (``arm``):

* **The launcher's lifeline.** ``run_streaming`` hands torchrun the read end of a pipe as stdin and keeps the
  write end; torchrun's ranks inherit that stdin. A watcher thread in each rank blocks reading it: end of file
  means every holder of the write end is gone, i.e. the launcher process died (however: SIGKILL included), and
  the rank SIGKILLs its torchrun (which would otherwise clean up, or restart workers, for nobody) and itself. A pipe
  closes with the *process*, whichever thread started torchrun (Prefect runs tasks in worker threads), which
  is why it is used for this link rather than ``PR_SET_PDEATHSIG`` (that fires when the forking *thread*
  exits).
* **Parent death (Linux).** ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill the rank when torchrun
  dies (torchrun forks its ranks from its main thread). A parent that died before the ``prctl`` call is
  caught by checking that the parent is still the launcher's child (``CODEMILL_LAUNCHER_PID``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

LIFELINE_FD_ENV = "CODEMILL_LIFELINE_FD"  # the fd (0: stdin) whose end of file means the launcher is gone
LAUNCHER_PID_ENV = "CODEMILL_LAUNCHER_PID"  # the launcher's pid: torchrun's parent, the rank's grandparent
PR_SET_PDEATHSIG = 1


def launcher_env(stdin_fd: int = 0) -> dict[str, str]:
    """What the launcher adds to torchrun's environment (ranks inherit it) when it passes a lifeline as stdin."""
    return {LIFELINE_FD_ENV: str(stdin_fd), LAUNCHER_PID_ENV: str(os.getpid())}


def arm() -> None:
    """Tie this rank's life to torchrun (parent-death signal) and to the launcher (its lifeline), if any."""
    die_with_parent()
    fd = os.environ.get(LIFELINE_FD_ENV)
    if fd is not None:
        torchrun = _launched_torchrun()
        threading.Thread(target=_watch, args=(int(fd), torchrun), name="codemill-lifeline", daemon=True).start()


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` when the parent exits (Linux only; returns whether it is armed)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        print(f"warning: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return False
    if _parent_already_gone():
        os.kill(os.getpid(), sig)
    return True


def _parent_already_gone() -> bool:
    """The parent died before the signal was armed: we were re-parented (to init, or a subreaper)."""
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    parent = os.getppid()
    if launcher is None:
        return parent == 1
    return parent != int(launcher) and parent_of(parent) != int(launcher)  # parent: torchrun, or the launcher


def _launched_torchrun() -> int | None:
    """The parent's pid when it is the process the launcher started (torchrun), not the launcher itself."""
    launcher, parent = os.environ.get(LAUNCHER_PID_ENV), os.getppid()
    if launcher is None or parent == int(launcher) or parent_of(parent) != int(launcher):
        return None
    return parent


def parent_of(pid: int) -> int | None:
    """A process's parent pid from /proc (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name (field 2) may hold spaces and parentheses


def _watch(fd: int, torchrun: int | None) -> None:
    """Block on the lifeline; at end of file (or an error reading it) the launcher is gone: kill torchrun (while
    it still is our parent, so the pid cannot have been reused) and this rank at once."""
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass
    if torchrun is not None and os.getppid() == torchrun:
        os.kill(torchrun, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
