"""The loop both sandbox servers of the judge harness share: one forked child per sample, then a clean slate.

Stdlib only, no ``from __future__``: the source is sent into the sandbox after ``wire.py`` (``servers.py``
builds the program). A server reads ``{"op": "sample", ...}`` frames from its control socket (the host), with
the sample's descriptors attached; forks a child that runs ``run_child(fds, msg)`` and never returns; waits
until the child ends or the host says the sample is over (``{"op": "end"}``), SIGKILLs the child, and then,
before it answers ``{"done": ...}``, removes everything the sample could leave for the next one: every other
process of the sandbox's uid, the writable folders' contents and System V IPC objects. The host starts the
next sample only after ``done``, so two samples never share state.

The server makes itself non-dumpable first (inherited by its children): a child of the same uid then cannot
ptrace it, or read its memory or descriptors through /proc. A child can still kill it; the host sees the
control socket close and starts a fresh server (and a fresh sandbox).
"""

import contextlib
import ctypes
import os
import resource
import select
import signal
import socket
import sys
import time

from codemill.sandbox.wire import ChannelClosed, recv_frame, send_frame

PR_SET_DUMPABLE = 4


def child_setup(keep, limits):
    """In a sample's child: stdio to /dev/null, every descriptor but ``keep`` closed, the rlimits applied."""
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        low = 3
        for fd in sorted(keep):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1 << 16)
        for name, value in limits.items():
            hard = value + 1 if name == "RLIMIT_CPU" else value
            resource.setrlimit(getattr(resource, name), (value, hard))
        # the child lives until it exits: these stay open for its whole life, no context to close them in
        sys.stdin = open(0)  # noqa: SIM115
        sys.stdout = open(1, "w")  # noqa: SIM115
        sys.stderr = open(2, "w")  # noqa: SIM115
    except BaseException:
        os._exit(70)


def describe(exc):
    """``Type: message`` of an exception, safe against objects whose ``__str__`` raises."""
    try:
        text = str(exc)
    except BaseException:
        text = "<unprintable>"
    try:
        name = str(type(exc).__name__)
    except BaseException:
        name = "Exception"
    return (name + ": " + text.replace("\n", " "))[:500]


def _sweep_processes(isolated):
    """SIGKILL every process the server may signal: in the sandbox that is all of the sample's leftovers."""
    if not isolated:  # unsafe mode shares the host's uid: only the child's own process group is ours
        return
    for _ in range(100):
        try:
            os.kill(-1, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        _reap()
        time.sleep(0.001)


def _reap():
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wipe(path):
    """Empty ``path`` without following links, one level at a time relative to the working directory: a tree
    deeper than the recursion limit, or one whose paths exceed PATH_MAX, goes as well as a flat one."""
    try:
        home = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        home = None
    try:
        os.chdir(path)
    except OSError:
        if home is not None:
            os.close(home)
        return
    entered: list[str] = []  # the folders entered below path
    stuck: list[set[str]] = [set()]  # per level, the folders that would not go
    try:
        while True:
            sub = None
            with os.scandir(".") as it:
                entries = list(it)
            for entry in entries:
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        os.unlink(entry.name)
                    elif sub is None and entry.name not in stuck[-1]:
                        sub = entry.name
                except OSError:
                    pass
            if sub is not None:  # a real folder (no link) and nothing of the sample runs any more: enter it
                try:
                    os.chmod(sub, 0o700)
                    os.chdir(sub)
                    entered.append(sub)
                    stuck.append(set())
                except OSError:
                    stuck[-1].add(sub)
                continue
            if not entered:
                return
            os.chdir("..")
            name = entered.pop()
            stuck.pop()
            try:
                os.rmdir(name)
            except OSError:
                stuck[-1].add(name)
    except OSError:
        return
    finally:
        if home is not None:
            os.fchdir(home)
            os.close(home)


def _is_empty(path):
    try:
        return not os.listdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False


# The kernel keeps a user keyring and a user-session keyring per uid, outside every namespace of the sandbox: a
# key one sample adds (add_key(2)) would be there for the next sample, even in a fresh sandbox of the same uid.
KEYCTL_CLEAR = 7
KEY_SPEC_USER_KEYRINGS = (-4, -5)
KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219, "riscv64": 219}


def _clear_keyrings(libc):
    number = KEYCTL_SYSCALL.get(os.uname().machine)
    if number is None:
        return
    for ring in KEY_SPEC_USER_KEYRINGS:
        libc.syscall(ctypes.c_long(number), ctypes.c_long(KEYCTL_CLEAR), ctypes.c_long(ring))


def _remove_sysv_ipc(libc):
    """System V shared memory, semaphores and message queues live in the IPC namespace, not in a folder."""
    for kind in ("shm", "sem", "msg"):
        try:
            with open("/proc/sysvipc/" + kind) as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 2:
                continue
            ipc_id = int(fields[1])
            if kind == "shm":
                libc.shmctl(ipc_id, 0, None)  # IPC_RMID
            elif kind == "sem":
                libc.semctl(ipc_id, 0, 0)
            else:
                libc.msgctl(ipc_id, 0, None)


def _cleanup(libc, isolated, writable):
    """Remove what a sample could leave for the next; False when something is left (the server then exits, and
    the host starts a fresh sandbox)."""
    _sweep_processes(isolated)
    for path in writable:
        _wipe(path)
    if isolated:
        _remove_sysv_ipc(libc)
        _clear_keyrings(libc)
    return all(_is_empty(path) for path in writable)


def _run_sample(ctrl, msg, fds, run_child, libc, isolated, writable):
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            ctrl.close()
            os.setsid()
            run_child(fds, msg)
        finally:
            os._exit(70)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    ended_by = "itself"
    try:
        select.select([ctrl, pidfd], [], [])
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            ended_by = "host"  # still running when the host ended the sample (verdict in, or clock ran out)
        if not isolated:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        wall = time.monotonic() - t0
        end = recv_frame(ctrl)  # the host's end of this sample (exactly one per sample keeps the frames in step)
    finally:
        os.close(pidfd)
    if not _cleanup(libc, isolated, writable):
        os._exit(75)  # never hand a dirty sandbox to the next sample: the host sees the server gone and restarts it
    info = {"ended_by": ended_by, "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 4), "wall_s": round(wall, 4),
            "maxrss_kb": usage.ru_maxrss, "op": end.get("op")}
    send_frame(ctrl, {"done": info})


def serve(ctrl_fd, role, run_child, isolated, writable, prepare=None):
    """Answer samples until the host closes the control socket or says quit."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if isolated:
        _clear_keyrings(libc)  # what an earlier server of this uid left, if it died before its cleanup
    if prepare is not None:
        prepare()
    ctrl = socket.socket(fileno=ctrl_fd)
    send_frame(ctrl, {"hello": role, "pid": os.getpid(), "uid": os.getuid()})
    while True:
        try:
            msg, fds = recv_frame(ctrl, want_fds=True)
        except ChannelClosed:
            return
        op = msg.get("op")
        if op == "sample" and fds:
            try:
                _run_sample(ctrl, msg, fds, run_child, libc, isolated, writable)
            except ChannelClosed:
                _cleanup(libc, isolated, writable)
                return
        elif op == "quit":
            return
        else:
            for fd in fds:
                os.close(fd)
            send_frame(ctrl, {"error": "unknown op " + repr(op)[:100]})
