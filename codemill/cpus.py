"""How many cores this process may really use: affinity mask and cgroup CPU quota, not the host's count.

``os.cpu_count()`` reports the host; in a container limited to 2 cores of a 64-core host it says 64, and
64 OpenMP threads per rank on 2 cores make training crawl.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs allowed by the cgroup (v2 ``cpu.max`` or v1 CFS quota), None when unlimited or unknown."""
    v2 = root / "cpu.max"
    try:
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        q, p = root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"
        if q.is_file() and p.is_file():
            quota_us = int(q.read_text())
            return None if quota_us <= 0 else quota_us / int(p.read_text())
    except (OSError, ValueError):
        return None
    return None


def usable_cpus() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_quota()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)
