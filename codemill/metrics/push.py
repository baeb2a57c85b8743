"""Batch work pushes its metrics to a Pushgateway: periodically on a daemon thread while it runs, once more at
the end, then marks the run finished (or deletes its group). A Pushgateway that does not answer never fails the
work: one warning, and ``codemill_metrics_push_failures_total`` counts every failed push.

Groups: ``{job, flow, flow_run}`` per run (``rank`` added for a torchrun rank, ``worker`` for a Ray rollout
worker), so runs never overwrite each other; and ``{job, flow}`` for the flow's last success and failure time,
which outlives any run's group (the "no successful nightly in 26 h" alert reads it).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Gauge, delete_from_gateway, push_to_gateway, pushadd_to_gateway
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from codemill import metrics

JOB = "codemill"
TIMEOUT_S = 5.0
log = logging.getLogger(__name__)


class Pusher:
    """Pushes ``registry`` to ``gateway`` under ``grouping``: every ``interval_s`` on a daemon thread, and on
    ``finish``."""

    def __init__(self, gateway: str, registry: Collector, grouping: dict[str, str],
                 interval_s: float = 15.0, job: str = JOB) -> None:
        self.gateway, self.registry, self.grouping, self.job = gateway, registry, grouping, job
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def start(self) -> Pusher:
        self.push()
        self._thread = threading.Thread(target=self._loop, name="codemill-metrics-push", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.push()

    def push(self) -> bool:
        """One push (the whole group replaced); False, a warning the first time and a count when it failed."""
        return self.attempt("push", lambda: push_to_gateway(self.gateway, self.job, self.registry, self.grouping,
                                                         timeout=TIMEOUT_S))

    def finish(self, delete: bool = False) -> None:
        """Stop the thread, push the final values; ``delete`` then removes the group from the Pushgateway."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=TIMEOUT_S * 2)
        self.push()
        if delete:
            self.attempt("delete", lambda: delete_from_gateway(self.gateway, self.job, self.grouping,
                                                            timeout=TIMEOUT_S))

    def attempt(self, what: str, fn: Callable[[], object]) -> bool:
        """Run one request to the Pushgateway; a failure is counted and warned about once per pusher."""
        try:
            fn()
            return True
        except Exception as e:  # a dead or refusing Pushgateway: never the run's failure
            metrics.get().push_failures.inc()
            if not self._warned:
                self._warned = True
                log.warning("metrics: %s to the Pushgateway %s failed (%s); the run goes on, further failures "
                            "are counted in codemill_metrics_push_failures_total", what, self.gateway, e)
            return False


def record_flow_outcome(pusher: Pusher, flow: str, succeeded: bool) -> None:
    """The flow's last success (or failure) time, in the ``{job, flow}`` group that outlives each run's (added
    to it: the other time stays)."""
    registry = CollectorRegistry()
    name = "success" if succeeded else "failure"
    Gauge(f"codemill_flow_last_{name}_timestamp_seconds", f"When a run of this flow last ended in {name} (Unix "
          "time).", registry=registry).set(time.time())
    pusher.attempt("push", lambda: pushadd_to_gateway(pusher.gateway, pusher.job, registry, {"flow": flow},
                                                      timeout=TIMEOUT_S))


_target: dict[str, str] = {}  # the flow run pushing from this process: inherited by the processes it starts


def child_env() -> dict[str, str]:
    """Environment for a process this flow run starts (torchrun): where to push, and the run's group."""
    if not _target:
        return {}
    return {metrics.ENV_PUSHGATEWAY: _target["gateway"], metrics.ENV_RUN: f"{_target['flow']}/{_target['flow_run']}"}


TRAINING_METRICS = ("codemill_train_", "codemill_checkpoint_", "codemill_metrics_push_failures")


class Only:
    """The families of ``registry`` whose names start with one of ``prefixes``: a torchrun rank pushes what it
    measures, not a zero for every metric of the flow (which would double the flow's series)."""

    def __init__(self, registry: CollectorRegistry, prefixes: tuple[str, ...]) -> None:
        self.registry, self.prefixes = registry, prefixes

    def collect(self) -> Iterator[Metric]:
        return (f for f in self.registry.collect() if f.name.startswith(self.prefixes))


ROLLOUT_METRICS = ("codemill_rollout_", "codemill_sandbox_", "codemill_metrics_push_failures")


def _member_pusher(gateway: str, flow: str, flow_run: str, member: dict[str, str], prefixes: tuple[str, ...],
                   interval_s: float) -> Pusher:
    """A pusher, started, for a process that works for a flow run: the run's group plus ``member`` (its rank or
    worker index), holding only the families it measures (``prefixes``), in a fresh registry it turns on."""
    grouping = {"flow": flow, "flow_run": flow_run, **member}
    return Pusher(gateway, Only(metrics.enable(fresh=True), prefixes), grouping, interval_s).start()


def rank_pusher(rank: int, interval_s: float = 15.0) -> Pusher | None:
    """A torchrun rank's pusher, started, when its flow run pushes metrics (``child_env``); else None. Its group
    is the flow run's plus ``rank``, and holds the training metrics only."""
    gateway, run = os.environ.get(metrics.ENV_PUSHGATEWAY), os.environ.get(metrics.ENV_RUN, "")
    if not gateway or "/" not in run:
        return None
    flow, flow_run = run.split("/", 1)
    return _member_pusher(gateway, flow, flow_run, {"rank": str(rank)}, TRAINING_METRICS, interval_s)


def worker_target() -> dict[str, str]:
    """Where a Ray worker of this flow run pushes (empty when the run pushes nothing): handed to the worker as an
    argument, since a Ray worker does not inherit the driver's environment."""
    return dict(_target)


def worker_pusher(target: dict[str, str], worker: int, interval_s: float = 15.0) -> Pusher | None:
    """A Ray rollout worker's pusher, started (None when ``target`` is empty): the flow run's group plus
    ``worker`` (its index, a small fixed set), holding the rollout and sandbox metrics it measures."""
    if not target:
        return None
    return _member_pusher(target["gateway"], target["flow"], target["flow_run"], {"worker": str(worker)},
                          ROLLOUT_METRICS, interval_s)


@contextmanager
def flow_metrics(gateway: str | None, flow: str, flow_run: str, interval_s: float = 15.0,
                 delete: bool = False) -> Iterator[None]:
    """Metrics on for one flow run (a fresh registry, so runs in one process never mix), pushed while it runs and
    at its end; a no-op when ``gateway`` is empty. The run's result is counted whether it succeeds or raises."""
    if not gateway:
        yield
        return
    with metrics.collecting() as registry:
        m = metrics.get()
        pusher = Pusher(gateway, registry, {"flow": flow, "flow_run": flow_run}, interval_s).start()
        _target.update(gateway=gateway, flow=flow, flow_run=flow_run)
        succeeded = False
        try:
            yield
            succeeded = True
        finally:
            m.flow_runs.labels(flow, "succeeded" if succeeded else "failed").inc()
            m.flow_finished.labels(flow).set(time.time())
            pusher.finish(delete)
            record_flow_outcome(pusher, flow, succeeded)
            _target.clear()
