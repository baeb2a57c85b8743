"""Resource limits of one sandboxed program, applied as rlimits in the child before bubblewrap starts.

Defaults are generous on purpose: a HumanEval check runs in milliseconds, so a 10 s wall clock and 10 s of
CPU leave two orders of magnitude of headroom, and a result only flips when a program really loops. The
reference harness uses 3 s; we keep its semantics (a program that does not finish is "timed out"). The wall
clock counts a program's own time, not the time the machine's load took from it (``clock.LoadClock``), so a
verdict does not depend on how busy the machine is; ``backstop`` times the wall clock is the hard limit.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 1 << 30  # address space (RLIMIT_AS); HumanEval checks need well under 100 MB
    file_bytes: int = 16 << 20  # largest file the program may write (RLIMIT_FSIZE)
    open_files: int = 64
    processes: int = 32  # per sandbox uid (RLIMIT_NPROC): stops fork bombs
    tmpfs_bytes: int = 64 << 20  # size of the private work dir
    backstop: float = 10.0  # a program the load holds back may take this many times its wall clock, no more

    @classmethod
    def of(cls, section: Any) -> Limits:
        """The limits a config section names (its ``wall_s``, ``cpu_s`` and ``memory_mb``)."""
        return cls(wall_s=section.wall_s, cpu_s=section.cpu_s, memory_bytes=section.memory_mb << 20)

    def apply(self, cpu: bool = True) -> None:
        """Called in the forked child (preexec): set every limit, hard = soft so nothing can raise them.
        ``cpu=False`` for a long-lived server, whose samples each get the CPU limit in their own child."""
        if cpu:
            resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_s, self.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_bytes, self.file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (self.processes, self.processes))

    def backstop_s(self, budget_s: float | None = None) -> float:
        """The hard wall clock of a program whose own budget is ``budget_s`` (``wall_s`` unless given)."""
        return self.backstop * (self.wall_s if budget_s is None else budget_s)

    def per_sample(self) -> dict[str, int]:
        """The limits a server's child sets for one sample (the others it inherits from the server)."""
        return {"RLIMIT_CPU": self.cpu_s, "RLIMIT_AS": self.memory_bytes}
