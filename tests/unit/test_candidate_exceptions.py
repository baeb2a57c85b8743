"""How the judge rebuilds an exception the candidate raised: its own type where the judge may, else a
CandidateError; never a type that escapes ``except Exception``."""

from __future__ import annotations

import statistics

import pytest

from codemill.sandbox.judge_server import CandidateError, candidate_exception


@pytest.mark.parametrize(("module", "qualname", "kind"), [
    ("builtins", "ValueError", ValueError), ("builtins", "KeyError", KeyError),
    ("statistics", "StatisticsError", statistics.StatisticsError), ("json.decoder", "JSONDecodeError", None),
])
def test_exceptions_of_loaded_modules_keep_their_type_and_message(module, qualname, kind):
    exc = candidate_exception(module, qualname, "the message")
    if kind is None:  # a constructor that wants more than one argument: the text still says what it was
        assert type(exc) is CandidateError and str(exc) == "json.decoder.JSONDecodeError: the message"
    else:
        assert type(exc) is kind and exc.args == ("the message",)


@pytest.mark.parametrize(("module", "qualname"), [
    ("builtins", "SystemExit"), ("builtins", "KeyboardInterrupt"), ("builtins", "BaseException"),
    ("builtins", "GeneratorExit"), ("unittest.case", "SkipTest"), ("not_loaded_anywhere", "Error"),
    ("builtins", "len"), ("builtins", "object"), ("os", "_exit"), ("builtins", "ValueError.__base__"),
    ("sys", "modules"), ("pytest", "PytestWarning"), ("doctest", "DocTestFailure"),
])
def test_anything_else_is_a_plain_candidate_error(module, qualname):
    """Not Exception subclasses, test-runner signals (a skipped unittest counts as successful), modules the judge
    has not loaded or that are not the standard library's, and names that are not exception types."""
    exc = candidate_exception(module, qualname, "m")
    assert type(exc) is CandidateError and isinstance(exc, Exception)
    assert str(exc).endswith(f"{qualname}: m")


def test_a_subclass_of_skiptest_elsewhere_in_the_stdlib_is_not_rebuilt_either(monkeypatch):
    import types
    import unittest

    fake = types.ModuleType("json")  # a stdlib module name the judge may have loaded
    fake.Sneaky = type("Sneaky", (unittest.SkipTest,), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "json", fake)
    assert type(candidate_exception("json", "Sneaky", "m")) is CandidateError
