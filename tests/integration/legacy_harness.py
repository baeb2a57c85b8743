"""The OLD HumanEval harness (``evals/humaneval.py`` at commit 30e5e8e), kept ONLY so the forgery tests can show
that each attack was a real hole before the judge harness (``sandbox/judge_pool.py``) replaced it.

Do not use it to score anything: it runs prompt + completion + tests + ``check()`` in ONE process and reads a
nonce-tagged verdict line from that process's stdout, so a completion can reach the nonce (frames, code
objects), the verdict descriptor (fd 1) and the tests' own names (``check``, builtins, helpers) and forge a
pass. ``_WRAPPER``, ``harness_program`` and ``interpret`` are verbatim copies; ``check_program`` is too, except that it
reads ``ExecProblem.tests`` (the old ``Problem`` called the field ``test``); only ``execute_old`` is new (one
sample on a ``Sandbox`` from ``sandbox/runner.py``, as the old ``execute`` ran each sample).
"""

from __future__ import annotations

import secrets

from codemill.problems.problem import ExecProblem
from codemill.sandbox import ExecResult, Outcome, Sandbox


def check_program(problem: ExecProblem, completion: str) -> str:
    return f"{problem.prompt}{completion}\n{problem.tests}\ncheck({problem.entry_point})"


_WRAPPER = '''import io as _io, os as _os, sys as _sys
_verdict = _os.dup(1)
_sink = _io.StringIO()
_sys.stdout = _sys.stderr = _sink
_sys.stdin = _io.StringIO()
try:
    exec(compile({source!r}, "<candidate>", "exec"), {{}})
except BaseException as _e:
    _os.write(_verdict, ("\\n{nonce} FAILED " + type(_e).__name__ + ": " + str(_e)[:300].replace("\\n", " ")
                         + "\\n").encode())
    _os._exit(1)
_os.write(_verdict, b"\\n{nonce} PASSED\\n")
_os._exit(0)
'''


def harness_program(source: str, nonce: str) -> str:
    return _WRAPPER.format(source=source, nonce=nonce)


def interpret(res: ExecResult, nonce: str) -> tuple[Outcome, str]:
    """Outcome of one sample from the sandbox result and the wrapper's verdict line."""
    if res.outcome in (Outcome.TIMED_OUT, Outcome.KILLED_MEMORY):
        return res.outcome, res.error
    verdicts = [ln for ln in res.stdout.splitlines() if ln.startswith(nonce)]
    if not verdicts:
        return Outcome.FAILED, res.error or "exited without a verdict"
    verdict = verdicts[-1][len(nonce) + 1:]
    if verdict == "PASSED" and res.outcome is Outcome.PASSED:
        return Outcome.PASSED, ""
    error = verdict.removeprefix("FAILED ")
    if error.startswith("MemoryError"):
        return Outcome.KILLED_MEMORY, error
    return Outcome.FAILED, error


def execute_old(problem: ExecProblem, completion: str, sandbox: Sandbox) -> tuple[Outcome, str]:
    """One sample through the old harness, with a fresh nonce as the old ``execute`` made per run. ``Sandbox.run``
    leases a uid no JudgePool holds, so the old harness's fork bomb cannot exhaust a pool's RLIMIT_NPROC."""
    nonce = secrets.token_hex(16)
    res = sandbox.run(harness_program(check_program(problem, completion), nonce))
    return interpret(res, nonce)
