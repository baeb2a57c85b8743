"""What a stage cost: wall time, CPU-seconds and GPU-seconds, measured around the work and summed per run.

CPU-seconds are user + system time of this process (every thread) and of its children that finished during
the stage (torchrun and its ranks are waited for, so training counts in full). GPU-seconds are the GPUs a
stage holds times its wall time (a training run on 8 GPUs for 10 s is 80 GPU-seconds), the unit GPU time is
billed in; a stage that ran on CPU has none. A stage skipped because its artifact was in the store cost
nothing in this run.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass

KEYS = ("wall_s", "cpu_s", "gpu_s")


@dataclass
class StageCost:
    wall_s: float = 0.0
    cpu_s: float = 0.0
    gpu_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """As MLflow metric names (``cost_wall_s`` ...)."""
        return {f"cost_{k}": v for k, v in asdict(self).items()}


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextmanager
def measure(gpus: int = 0) -> Iterator[StageCost]:
    """Measure the block: the yielded StageCost is filled in when the block ends (also when it raises)."""
    cost = StageCost()
    t0, c0 = time.perf_counter(), _cpu_seconds()
    try:
        yield cost
    finally:
        cost.wall_s = time.perf_counter() - t0
        cost.cpu_s = _cpu_seconds() - c0
        cost.gpu_s = cost.wall_s * gpus


def cost_line(stage: str, status: str, cost: Mapping[str, float] | None) -> str:
    """One line of the run report: ``train      ran      wall 41.2 s  CPU 80.3 s  GPU 0.0 s``."""
    if status != "ran" or not cost:
        return f"{stage:<18} {'skipped':<8} (artifact in the store: no cost in this run)"
    return (f"{stage:<18} {'ran':<8} wall {cost.get('wall_s', 0.0):7.1f} s  CPU {cost.get('cpu_s', 0.0):7.1f} s  "
            f"GPU {cost.get('gpu_s', 0.0):6.1f} s")


def total(costs: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    return {k: sum(c.get(k, 0.0) for c in costs.values()) for k in KEYS}
