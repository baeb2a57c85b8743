"""Host side of one long-lived sandbox server (candidate or judge): start it, hand it samples, end them.

The program sent into the sandbox is the source of ``wire.py`` + ``forkserver.py`` + the role's module, with
the package imports dropped (the sandbox runs ``python -I -S`` on the standard library only) and a call of
``serve`` at the end. The control socket is one end of a socketpair passed as an inherited descriptor.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codemill.evals.sandbox.runner import SANDBOX_UID_BASE, Sandbox, SandboxUnavailable
from codemill.evals.sandbox.wire import BadData, ChannelClosed, ChannelTimeout, recv_frame, send_frame

HERE = Path(__file__).parent
ROLES = {"candidate": "candidate_server.py", "judge": "judge_server.py"}
SANDBOX_WRITABLE = ("/tmp", "/work", "/dev/shm", "/dev/mqueue")
JUDGE_UID_OFFSET = 500  # judge uids sit apart from candidate uids, so no slot's candidate shares one
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


def role_uid(role: str, slot: int) -> int:
    return SANDBOX_UID_BASE + slot + (JUDGE_UID_OFFSET if role == "judge" else 0)


def with_mqueue(argv: list[str]) -> list[str]:
    """bwrap's argv plus a private mqueue mount at /dev/mqueue. POSIX message queues live in the sandbox's IPC
    namespace, which outlives a sample; only through this mount can the server list and remove (``_wipe``) the
    queues a sample created, which the next sample could otherwise open by name."""
    end = argv.index("--")  # the end of bwrap's own options
    return [*argv[:end], "--mqueue", "/dev/mqueue", *argv[end:]]


class ServerDied(RuntimeError):
    """A server stopped answering; the pool restarts it."""


@dataclass
class Server:
    """One running server process and its control socket."""

    role: str
    slot: int
    proc: subprocess.Popen
    ctrl: socket.socket
    workdir: str | None
    hello: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, sandbox: Sandbox, role: str, slot: int) -> Server:
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        server_fd = server_end.fileno()
        workdir = None
        writable: tuple[str, ...]
        isolated = not sandbox.unsafe
        if isolated:
            argv, cwd, env, writable = sandbox.command(slot, uid=role_uid(role, slot)), None, {}, SANDBOX_WRITABLE
            argv = with_mqueue(argv)
        else:
            workdir = tempfile.mkdtemp(prefix=f"codemill-{role}-")
            argv, cwd, env, writable = sandbox.command(slot), workdir, {"PATH": "/usr/bin:/bin"}, (workdir,)
        limits = sandbox.limits
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, cwd=cwd, env=env, pass_fds=(server_fd,),
                                    preexec_fn=lambda: limits.apply(cpu=False), start_new_session=True)
        except OSError as exc:
            host_end.close()
            raise SandboxUnavailable(f"the {role} sandbox cannot start: {exc}") from exc
        finally:
            server_end.close()
        server = cls(role, slot, proc, host_end, workdir)
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
        if isolated and server.hello.get("uid") != role_uid(role, slot):
            server.stop()
            raise SandboxUnavailable(f"the {role} server runs as uid {server.hello.get('uid')}, not its own")
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
