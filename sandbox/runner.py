"""bubblewrap sandbox: no network, read-only system, private tmpfs work dir, own PID namespace, cleared env.

Layers, outermost first:
1. A wall clock in the parent that SIGKILLs the whole process group (bwrap runs in its own session). It counts
   the program's own time, not the time the machine's load made it wait for a CPU (``clock.LoadClock``), up to a
   hard backstop.
2. rlimits (CPU, address space, file size, open files, processes, no core dumps) set before exec.
3. bwrap: new pid/net/ipc/uts/cgroup (and, unprivileged, user) namespaces, ``--die-with-parent``, ``--new-session``,
   ``--clearenv``, all capabilities dropped, only the system and interpreter directories bound read-only,
   and a size-capped tmpfs as the work dir. When the program exits, the PID namespace dies with it, so no
   background process outlives it.
4. When codemill runs as root, bwrap sets up the mounts as root (it can bind an interpreter under /root)
   and ``setpriv`` then drops to a uid no other sandbox holds (``uids.LEASES``) with no capabilities, an empty bounding
   set and no-new-privs. A uid of its own matters: the kernel exempts root, and user namespaces mapped to
   root, from RLIMIT_NPROC, so only a real unprivileged uid makes the fork-bomb limit bite, per sandbox.

``probe()`` must succeed before anything runs: the sandbox fails closed. ``unsafe`` mode (explicit opt-in)
keeps the rlimits, the clock, a cleared environment and a throwaway work dir, but no isolation and no uid
change (as root the process limit then does not apply).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from codemill.sandbox import binary
from codemill.sandbox.binary import Bwrap, SandboxUnavailable
from codemill.sandbox.clock import STARVED, LoadClock
from codemill.sandbox.limits import Limits
from codemill.sandbox.procstat import Meter
from codemill.sandbox.uids import LEASES

OUTPUT_TAIL = 4000


class Outcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    KILLED_MEMORY = "killed_memory"


@dataclass(frozen=True)
class ExecResult:
    outcome: Outcome
    returncode: int
    error: str
    duration_s: float
    stdout: str = ""
    waited_s: float = 0.0  # time the machine's load made it wait for a CPU, not counted against its wall clock


def _interpreter_dirs() -> list[str]:
    exe = os.path.realpath(sys.executable)
    dirs = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), os.path.dirname(exe)}
    return sorted(d for d in dirs if not d.startswith("/usr/"))


def _system_mounts() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


class Sandbox:
    def __init__(self, limits: Limits | None = None, *, unsafe: bool = False,
                 python: str | None = None, overlay: bool = False) -> None:
        self.limits = limits or Limits()
        self.unsafe = unsafe
        self.overlay = overlay  # mounts overlayfs: needs bubblewrap >= 0.10 (binary.resolve)
        self.python = python or os.path.realpath(sys.executable)
        self.as_root = os.geteuid() == 0
        self._bwrap: Bwrap | None = None

    @property
    def bwrap(self) -> Bwrap:
        """The binary that isolates (``binary.resolve``): chosen on first use, so a Sandbox in ``unsafe`` mode or
        one that is never run needs none; raises SandboxUnavailable naming what is missing."""
        if self._bwrap is None:
            self._bwrap = binary.resolve(overlay=self.overlay)
        return self._bwrap

    def describe(self) -> dict[str, str]:
        """What isolates this sandbox's verdicts, for the manifest and the MLflow run."""
        if self.unsafe:
            return {"isolation": "none (unsafe_no_sandbox)"}
        return {"isolation": "bwrap", **self.bwrap.record()}

    # --- the command -----------------------------------------------------------------------------------
    def command(self, uid: int) -> list[str]:
        """The argv that runs Python (program on stdin) in a fresh sandbox as ``uid`` (a leased one: ``uids``)."""
        return self.wrap(uid, [self.python, "-I", "-S", "-B", "-"])

    def wrap(self, uid: int, argv: list[str], mounts: tuple[str, ...] = (), chdir: str = "/work",
             env: dict[str, str] | None = None) -> list[str]:
        """``argv`` run in a fresh sandbox as ``uid``: the system and interpreter folders read-only, private
        ``/tmp`` and ``/work``, then ``mounts`` (more bwrap mount arguments, e.g. a repository's overlay),
        ``chdir`` as the working folder and ``env`` on top of PATH, HOME and PYTHONHASHSEED."""
        if self.unsafe:
            if mounts or chdir != "/work":
                raise SandboxUnavailable("unsafe mode runs no sandbox, so it cannot mount a repository's tree; "
                                         "repository tasks need the sandbox")
            return argv
        bwrap = self.bwrap.path
        if self.as_root:
            setpriv = binary.require_setpriv()
            namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                          "--unshare-cgroup-try"]
            drop = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                    "--bounding-set=-all", "--no-new-privs", "--"]
        else:
            namespaces, drop = ["--unshare-all", "--cap-drop", "ALL"], []
        args = [bwrap, *namespaces, "--die-with-parent", "--new-session", "--clearenv", "--hostname",
                "sandbox", *_system_mounts()]
        for d in _interpreter_dirs():
            args += ["--ro-bind", d, d]
        size = str(self.limits.tmpfs_bytes)
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
                 "--perms", "1777", "--size", size, "--tmpfs", "/work", *mounts, "--chdir", chdir]
        for key, value in {"PATH": "/usr/bin:/bin", "HOME": "/work", "PYTHONHASHSEED": "0", **(env or {})}.items():
            args += ["--setenv", key, value]
        return [*args, "--", *drop, *argv]

    def _preexec(self):
        """Applied in the child before exec: the rlimits (the uid drop is setpriv's, in the command)."""
        limits = self.limits

        def setup() -> None:
            limits.apply()

        return setup

    # --- running ---------------------------------------------------------------------------------------
    def probe(self) -> dict[str, str]:
        """Fail closed: start one sandbox and check it runs Python and has no network. Returns ``describe()``:
        the binary that isolated it and its version."""
        if self.unsafe:
            return self.describe()
        program = ("import socket\ns = socket.socket()\ns.settimeout(1)\n"
                   "try:\n    s.connect(('1.1.1.1', 53))\n    print('NETWORK')\nexcept OSError:\n"
                   "    print('ISOLATED')\n")
        try:
            res = self.run(program)
        except SandboxUnavailable as exc:
            raise SandboxUnavailable(f"the sandbox cannot start: {exc}", hint=exc.hint) from exc
        except OSError as exc:
            raise SandboxUnavailable(f"the sandbox cannot start: {exc}") from exc
        if res.stdout.strip() != "ISOLATED":
            refusal = binary.namespace_refusal(res.error, binary.read_sysctls(), self.as_root)
            if refusal is not None:
                raise refusal
            raise SandboxUnavailable(f"the sandbox did not start or is not isolated (outcome {res.outcome}, "
                                     f"exit {res.returncode}, {self.bwrap.path}): {res.error or res.stdout}"[:2000])
        return self.describe()

    def run(self, program: str) -> ExecResult:
        """Run one program (Python source on stdin) as a uid no other sandbox holds; exit status 0 means passed."""
        return self.execute([self.python, "-I", "-S", "-B", "-"], stdin=program.encode())

    def execute(self, argv: list[str], *, stdin: bytes = b"", mounts: tuple[str, ...] = (), chdir: str = "/work",
                env: dict[str, str] | None = None, uid: int | None = None,
                output_budget: int | None = None) -> ExecResult:
        """Run ``argv`` in a fresh sandbox (``wrap``) under the wall clock; its output's tails come back.
        ``uid``: one the caller already leased (it prepared files for it); None leases one for this run.
        ``output_budget``: stdout comes back whole up to that many bytes, else its head and tail with the
        middle cut (what an agent reads of a command's output)."""
        with contextlib.ExitStack() as stack:
            if uid is None:
                uid = stack.enter_context(LEASES.lease())
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="codemill-sbx-"))
            out_path, err_path = Path(tmp) / "out", Path(tmp) / "err"
            cwd = tmp
            if self.unsafe:
                cwd = os.path.join(tmp, "work")
                os.mkdir(cwd)
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                t0 = time.monotonic()
                proc = subprocess.Popen(self.wrap(uid, argv, mounts, chdir, env), stdin=subprocess.PIPE, stdout=out,
                                        stderr=err, cwd=cwd,
                                        env={"PATH": "/usr/bin:/bin", **(env or {})} if self.unsafe else {},
                                        preexec_fn=self._preexec(), start_new_session=True)
            with proc:
                # A watchdog kills the group when the clock runs out while this thread blocks in waitpid: Popen's
                # own timed wait polls with sleeps of up to 50 ms, a few ms of every short command.
                clock = LoadClock.started(self.limits.wall_s, self.limits.backstop_s(), t0)
                finished, ended = threading.Event(), list[str]()
                watchdog = threading.Thread(target=_watch, args=(proc, clock, finished, ended), daemon=True)
                watchdog.start()
                try:
                    proc.communicate(stdin)
                except BrokenPipeError:
                    proc.wait()
                finally:
                    finished.set()
                    watchdog.join()
                    if proc.poll() is None:  # interrupted (KeyboardInterrupt): the group must not outlive us
                        _expire(proc)
                        proc.wait()
                duration = time.monotonic() - t0
            stdout = _tail(out_path) if output_budget is None else middle(out_path, output_budget)
            stderr = _tail(err_path)
        return classify(proc.returncode, stderr, stdout, duration, ended[0] if ended else None, clock.credit_s)


def middle(path: Path, budget: int) -> str:
    """A file's text, or its first and last ``budget // 2`` bytes around a line that says how much was cut."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if size <= budget:
            return fh.read().decode("utf-8", errors="replace")
        head = fh.read(budget // 2)
        fh.seek(size - budget // 2)
        tail = fh.read()
    cut = size - len(head) - len(tail)
    return (head.decode("utf-8", errors="replace") + f"\n[... {cut} bytes of output cut ...]\n"
            + tail.decode("utf-8", errors="replace"))


def _watch(proc: subprocess.Popen, clock: LoadClock, finished: threading.Event, ended: list[str]) -> None:
    """Until ``finished``: at each deadline read what the sandbox's processes used, and kill the group once the
    clock says the program is out of time (``ended`` then holds how: timed out, or starved at the backstop)."""
    meter: Meter | None = None
    while not finished.wait(max(0.0, clock.deadline() - time.monotonic())):
        if proc.poll() is not None:
            return
        if meter is None:  # the tree exists by now; every process in it is the program's, from its start
            meter = Meter.of_command(proc.pid)
        kind = clock.check(meter.read())
        if kind is not None:
            if _expire(proc):
                ended.append(kind)
            return


def _expire(proc: subprocess.Popen) -> bool:
    """SIGKILL the program's process group; False when it had already ended."""
    if proc.poll() is not None:  # already reaped: its group id may name another group by now
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return True


def _tail(path: Path) -> str:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - OUTPUT_TAIL))
        return fh.read().decode("utf-8", errors="replace")


def last_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


CPU_LIMIT_SIGNALS = {signal.SIGXCPU, signal.SIGKILL}
BACKSTOP_ERROR = "wall-clock backstop (the machine's load held it back past its wall clock many times over)"


def classify(returncode: int, stderr: str, stdout: str, duration: float, clock_ended: str | None = None,
             waited_s: float = 0.0) -> ExecResult:
    """Map how the program ended to an outcome. bwrap reports a child killed by signal N as 128+N.
    ``clock_ended``: how the wall clock ended it, if it did (``clock.TIMED_OUT`` or ``clock.STARVED``)."""
    outcome, error = _outcome(returncode, last_error_line(stderr), clock_ended)
    return ExecResult(outcome, 0 if outcome is Outcome.PASSED else returncode, error, duration, stdout, waited_s)


def _outcome(returncode: int, error: str, clock_ended: str | None) -> tuple[Outcome, str]:
    if clock_ended is not None:
        return Outcome.TIMED_OUT, error or (BACKSTOP_ERROR if clock_ended == STARVED else "wall-clock limit")
    if returncode == 0:
        return Outcome.PASSED, ""
    sig = -returncode if returncode < 0 else (returncode - 128 if returncode > 128 else 0)
    if sig in CPU_LIMIT_SIGNALS:
        return Outcome.TIMED_OUT, error or f"killed by {signal.Signals(sig).name}"
    if error.startswith("MemoryError") or "Cannot allocate memory" in error:
        return Outcome.KILLED_MEMORY, error
    if sig:
        return Outcome.FAILED, error or f"killed by {signal.Signals(sig).name}"
    return Outcome.FAILED, error
