"""A CLI run keeps the flow's INFO lines off the terminal (Prefect's console handler at WARNING) unless
``--verbose``; Prefect reads the switch at import, so a fresh interpreter checks what it really does."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from codemill import cli
from codemill.config import PipelineConfig

CONSOLE_LEVEL = """
import logging
from prefect.logging.configuration import setup_logging
from prefect.logging.handlers import PrefectConsoleHandler
setup_logging()
print(min(h.level for h in logging.getLogger().handlers + logging.getLogger("prefect").handlers
          if isinstance(h, PrefectConsoleHandler)))
"""


@pytest.mark.parametrize(("verbose", "level"), [(False, logging.WARNING), (True, logging.NOTSET)])
def test_console_level_in_a_fresh_interpreter(verbose, level, monkeypatch):
    environ = {k: v for k, v in os.environ.items() if k not in cli.QUIET_CONSOLE_LOGS}
    monkeypatch.setattr(os, "environ", environ)  # what _prefect_defaults sets stays in this test
    cli._prefect_defaults(PipelineConfig(), verbose)
    done = subprocess.run([sys.executable, "-c", CONSOLE_LEVEL], capture_output=True, text=True, timeout=120,
                          env=environ)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) == level
