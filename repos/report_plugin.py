"""The pytest plugin that records each test's outcome for the grader (``-p _codemill_report``).

It is copied into every execution environment (read-only in the sandbox) and appends one JSON line per test
phase to ``/report/outcomes.jsonl`` as the run goes, so a run cut by the wall clock still says what ran. It runs
in the tests' own process, so the code under test can reach it: the grader never trusts it alone (controls
whose outcome is known, every expected id present and passed; ``codemill.repos.grading``).
"""

from __future__ import annotations

import json
import os

PATH = "/report/outcomes.jsonl"
_out = None


def _write(record: dict) -> None:
    global _out
    if _out is None:
        _out = open(PATH, "a", buffering=1)  # noqa: SIM115 - open for the whole session, one line per phase
    _out.write(json.dumps(record) + "\n")


def _message(report) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None:
        return str(crash.message)[:2000]
    longrepr = getattr(report, "longrepr", None)
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return str(longrepr[2])[:2000]
    return str(longrepr or "")[-2000:]


def pytest_runtest_logreport(report) -> None:
    outcome = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    _write({"id": report.nodeid, "when": report.when, "outcome": outcome,
            "message": _message(report) if outcome != "passed" else ""})


def pytest_collectreport(report) -> None:
    if report.failed:
        _write({"id": report.nodeid, "when": "collect", "outcome": "error", "message": _message(report)})


def pytest_deselected(items) -> None:
    for item in items:
        _write({"id": item.nodeid, "when": "collect", "outcome": "deselected", "message": ""})


def pytest_sessionfinish(session, exitstatus) -> None:
    _write({"id": "", "when": "session", "outcome": str(int(exitstatus)), "message": str(os.getpid())})
