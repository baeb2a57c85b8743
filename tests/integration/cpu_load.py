"""Every core kept busy on purpose: processes spinning at full CPU, pinned to each core the tests may use, for as
long as a ``with`` block (or the ``busy_cores`` fixture) lasts. A machine busy with other work must not change a
verdict; these make it busy for certain, whatever else runs on it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


@contextlib.contextmanager
def spinning(per_core: int) -> Iterator[list[subprocess.Popen]]:
    """``per_core`` spinning processes on every core of this process's affinity mask; killed on exit."""
    procs: list[subprocess.Popen] = []
    try:
        for cpu in sorted(os.sched_getaffinity(0)):
            # each in a session of its own, as other work is: with autogroup scheduling the kernel shares a
            # core between sessions first, so spinners in one session would weigh no more than one process
            procs += [subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)], start_new_session=True)
                      for _ in range(per_core)]
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
