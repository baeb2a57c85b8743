"""The declared system programs: a missing one skips with its install line, or fails under ``.ci/run``'s
switch; ``.ci/run`` installs exactly the declared packages and sets the switch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import system_tools
from tests.system_tools import REQUIRE_ENV, SystemTool

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def absent_tool(monkeypatch: pytest.MonkeyPatch) -> str:
    tool = SystemTool("absent", ("codemill-no-such-program",), "codemill-absent", "nothing")
    monkeypatch.setitem(system_tools.TOOLS, tool.name, tool)
    return tool.name


def test_missing_tool_skips_with_its_install_line(absent_tool, monkeypatch):
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install codemill-absent"):
        system_tools.require(absent_tool)


def test_missing_tool_fails_when_required(absent_tool, monkeypatch):
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="codemill-no-such-program not installed"):
        system_tools.require(absent_tool)


def test_present_tool_passes(monkeypatch):
    monkeypatch.setitem(system_tools.TOOLS, "sh", SystemTool("sh", ("sh",), "dash", "a shell"))
    monkeypatch.setenv(REQUIRE_ENV, "1")
    system_tools.require("sh")


def test_ci_installs_the_declared_packages_and_requires_them():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "$(python3 tests/system_tools.py)" in ci
    assert f"export {REQUIRE_ENV}=1" in ci
