"""Prometheus metrics: off by default (every metric a no-op), on for a flow run pushing to a Pushgateway, or for a
long-running process serving ``/metrics``.

Code that counts something calls ``metrics.get().<metric>``; it never asks whether metrics are on. Which
process pushes or serves is decided once, at its edge (the flows, the trainer's rank 0, ``codemill serve``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, disable_created_metrics

from codemill.metrics.definitions import OFF, Metrics, build

ENV_PUSHGATEWAY = "CODEMILL_METRICS_PUSHGATEWAY"
ENV_RUN = "CODEMILL_METRICS_RUN"  # the flow run a torchrun job belongs to (its push group)

_current: Metrics = OFF
_registry: CollectorRegistry | None = None


def get() -> Metrics:
    """The live metrics, or the no-op set when metrics are off."""
    return _current


def enabled() -> bool:
    return _current is not OFF


def enable(fresh: bool = False) -> CollectorRegistry:
    """Turn metrics on in this process: the registry they are collected in (the current one, unless ``fresh``
    asks for a new one: a flow run counts only its own work)."""
    global _current, _registry
    if _registry is None or fresh:
        disable_created_metrics()  # no ``_created`` twin of every counter: half the series, nothing lost
        _registry = CollectorRegistry()
        _current = build(_registry)
    return _registry


@contextmanager
def collecting() -> Iterator[CollectorRegistry]:
    """Metrics on for the block in a fresh registry (a flow run counts only its own work); what was live before
    (off, or the ``/metrics`` registry of ``codemill serve``) is live again after."""
    global _current, _registry
    before = _current, _registry
    try:
        yield enable(fresh=True)
    finally:
        _current, _registry = before


def disable() -> None:
    """Back to no-ops (tests, and the benchmark's "off" side)."""
    global _current, _registry
    _current, _registry = OFF, None


__all__ = ["ENV_PUSHGATEWAY", "ENV_RUN", "Metrics", "collecting", "disable", "enable", "enabled", "get"]
