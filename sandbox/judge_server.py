"""The trusted side of the judge harness: runs a problem's tests and writes the verdict, inside its own sandbox.

Sent into a bubblewrap sandbox of its own (after ``wire.py`` and ``forkserver.py``), as a uid other than the
candidate's. Per sample a forked child executes the problem's prompt (for the helpers tests call) and tests in
a fresh namespace, binds the entry point to a proxy that calls the candidate's function in the *other*
sandbox over a socket with plain-data arguments and results, runs ``check(candidate)`` and then every separate
test case, and writes the verdict to a socket only the host holds the other end of. The candidate's code never
runs in this process: it cannot see these frames, the expected values, or the verdict socket; all it can do is
answer calls, and an answer that is not plain data, a dead or silent candidate, or a broken channel fails the
sample whatever the tests do with the exception (a sticky flag, and exceptions tests cannot catch with
``except Exception``).
"""

import builtins
import contextlib
import os
import socket
import sys

from codemill.sandbox.forkserver import child_setup, describe
from codemill.sandbox.wire import BadData, ChannelClosed, decode_value, encode_value, recv_frame, send_frame

MAX_RESULT_BYTES = 16 << 20
PREIMPORT = ("doctest", "math", "collections", "itertools", "re")  # what tests commonly import (mined tests: doctest)


def prepare():
    """Import once in the server what tests import, so each forked child finds them loaded (doctest: ~90 ms)."""
    for name in PREIMPORT:
        with contextlib.suppress(ImportError):
            __import__(name)


class CandidateError(Exception):
    """The candidate raised an exception whose type the judge does not rebuild (see ``candidate_exception``)."""


class CandidateBroken(BaseException):
    """The candidate cannot answer any more (exited, killed, sent bad data); not catchable as Exception."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


# Test runners read these as "not a failure" (a skipped unittest counts as successful): a candidate must not be
# able to raise them in the judge, whatever module the tests loaded.
NEVER_REBUILT_MODULES = frozenset({"unittest", "doctest", "pytest", "_pytest"})


def candidate_exception(module, qualname, message):
    """The exception the candidate raised, rebuilt in the judge from three strings: its own type when that is an
    ``Exception`` subclass of a standard-library module the judge itself has loaded (builtins, what the prompt
    and tests import: ``statistics.StatisticsError``), else ``CandidateError``. Nothing is imported or called on
    the candidate's say-so beyond an attribute lookup of public names and the type's constructor with one
    string. Types that are not ``Exception`` subclasses (``SystemExit``, ``KeyboardInterrupt``) and test-runner
    signals (``unittest.SkipTest``) never cross as themselves."""
    kind = None
    top = module.split(".", 1)[0]
    owner = builtins if module == "builtins" else sys.modules.get(module)
    parts = qualname.split(".")
    if (owner is not None and (top == "builtins" or top in sys.stdlib_module_names)
            and top not in NEVER_REBUILT_MODULES
            and all(p.isidentifier() and not p.startswith("_") for p in parts)):
        kind = owner
        for part in parts:
            kind = getattr(kind, part, None)
    skip = getattr(sys.modules.get("unittest"), "SkipTest", None)
    if (isinstance(kind, type) and issubclass(kind, Exception)
            and not (isinstance(skip, type) and issubclass(kind, skip))):
        try:
            exc = kind(message)
            if type(exc) is kind:
                return exc
        except Exception:
            pass
    shown = qualname if module == "builtins" else module + "." + qualname
    return CandidateError(shown + ": " + message)


class Candidate:
    """Calls the candidate's function across the boundary; ``broken`` once set stays set."""

    def __init__(self, conn):
        self.conn = conn
        self.broken = None

    def _fail(self, kind, message):
        if self.broken is None:
            self.broken = (kind, message)
        raise CandidateBroken(*self.broken)

    def receive(self):
        if self.broken is not None:
            raise CandidateBroken(*self.broken)
        try:
            return recv_frame(self.conn, max_bytes=MAX_RESULT_BYTES)
        except ChannelClosed:
            self._fail("candidate_gone", "the candidate exited or was killed")
        except BadData as exc:
            self._fail("bad_data", "the candidate sent a malformed frame: " + str(exc))

    def __call__(self, *args, **kwargs):
        if self.broken is not None:
            raise CandidateBroken(*self.broken)
        try:
            send_frame(self.conn, {"args": encode_value(list(args)), "kwargs": encode_value(kwargs)})
        except TypeError as exc:
            raise TypeError("the tests passed an argument that is not plain data: " + str(exc)) from None
        except OSError:
            self._fail("candidate_gone", "the candidate exited or was killed")
        reply = self.receive()
        if type(reply.get("ok")) is str and len(reply) == 1:
            try:
                return decode_value(reply["ok"])
            except BadData as exc:
                self._fail("bad_data", "the candidate's result is not plain data: " + str(exc))
        if "bad_result" in reply:
            self._fail("bad_data", "the candidate's result is not plain data: " + str(reply["bad_result"])[:300])
        raised = reply.get("raise")
        if type(raised) is list and len(raised) == 3 and all(type(x) is str for x in raised):
            raise candidate_exception(raised[0][:200], raised[1][:200], raised[2][:2000])
        self._fail("bad_data", "the candidate sent a frame the protocol does not allow")


def _verdict(kind, passed=False, partial=0.0, error="", cases=(0, 0)):
    return {"kind": kind, "passed": passed, "partial": partial, "error": error[:500], "cases": list(cases)}


def judge(msg, candidate):
    """The verdict of one sample; everything the candidate can influence is a call's plain-data answer."""
    try:
        first = candidate.receive()
    except CandidateBroken as exc:  # gone before it loaded (os._exit at import time, a crash of the child)
        return _verdict(exc.kind, error=str(exc))
    if "load_error" in first:
        return _verdict("load_error", error=str(first["load_error"])[:500])
    if first != {"ready": True}:
        return _verdict("bad_data", error="the candidate did not report ready")
    namespace: dict = {"__name__": "__judge__"}
    try:
        exec(compile(msg["prompt"], "<prompt>", "exec"), namespace)
    except SyntaxError:  # a prompt that is only text (or ends mid-statement) defines no helpers
        namespace = {"__name__": "__judge__"}
    namespace[msg["entry"]] = candidate
    passed, error = False, ""
    try:
        exec(compile(msg["tests"], "<tests>", "exec"), namespace)
        namespace["check"](candidate)
        passed = True
    except CandidateBroken:
        pass
    except BaseException as exc:
        error = describe(exc)
    cases = msg.get("test_cases") or []
    good = 0
    for case in cases:
        if candidate.broken is not None:
            break
        try:
            exec(compile(case, "<test case>", "exec"), dict(namespace, candidate=candidate))
            good += 1
        except BaseException:
            pass
    if candidate.broken is not None:  # whatever the tests did with the exception, a broken channel fails
        kind, message = candidate.broken
        return _verdict(kind, error=message, cases=(good, len(cases)))
    partial = good / len(cases) if cases else float(passed)
    return _verdict("passed" if passed else "failed", passed, partial, error, (good, len(cases)))


def run_child(fds, msg):
    """fds: [connection to the candidate, verdict socket]. Never returns."""
    child_setup(fds, msg["limits"])
    conn, verdict_sock = socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1])
    try:
        verdict = judge(msg, Candidate(conn))
    except BaseException as exc:  # the judge's own failure (a broken test file): never a pass
        verdict = _verdict("judge_error", error=describe(exc))
    try:
        send_frame(verdict_sock, {"verdict": verdict})
    finally:
        os._exit(0)
