"""The metrics layer without servers: off by default (every metric a no-op), names and labels by the Prometheus
conventions, a dead Pushgateway never fails a run (one warning, every failure counted), and the setting never
changes an artifact digest."""

from __future__ import annotations

import logging
import re
from dataclasses import fields
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from codemill import metrics
from codemill.config import PipelineConfig
from codemill.metrics.config import MetricsConfig
from codemill.metrics.definitions import OFF, Metrics, build
from codemill.metrics.push import Pusher, flow_metrics
from tests.conftest import free_port

# The only label names a metric may have: each takes values from a small fixed set.
BOUNDED_LABELS = {"stage", "result", "flow", "suite", "outcome", "reason", "kind", "rank", "split"}
BASE_UNIT_SUFFIXES = ("_seconds", "_bytes", "_total", "_per_second")


@pytest.fixture(autouse=True)
def _metrics_off():
    yield
    metrics.disable()


def test_metrics_are_off_by_default_and_every_metric_is_a_no_op():
    assert not metrics.enabled() and metrics.get() is OFF
    for f in fields(Metrics):
        metric = getattr(metrics.get(), f.name)
        metric.labels("a", "b").inc()
        metric.inc(2)
        metric.dec()
        metric.set(1.0)
        metric.observe(0.5)


def test_names_follow_the_conventions_and_labels_are_bounded():
    registry = CollectorRegistry()
    build(registry)
    families = list(registry.collect())
    assert len(families) == len(fields(Metrics))
    for family in families:
        name = family.name + ("_total" if family.type == "counter" else "")
        assert re.fullmatch(r"codemill_[a-z0-9_]+", name), name
        if family.type == "counter":
            assert name.endswith("_total"), name
        if "second" in name or "byte" in name:
            assert name.endswith(BASE_UNIT_SUFFIXES), f"{name}: not in base units"
    labels = {label for m in (getattr(build(CollectorRegistry()), f.name) for f in fields(Metrics))
              for label in m._labelnames}
    assert labels <= BOUNDED_LABELS, labels - BOUNDED_LABELS


def test_every_metric_is_documented():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    registry = CollectorRegistry()
    build(registry)
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"| `{name}` |" in docs, f"{name} is not in docs/observability.md's table"


def test_a_dead_pushgateway_warns_once_counts_every_failure_and_never_raises(caplog):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    with caplog.at_level(logging.WARNING, logger="codemill.metrics.push"), \
            flow_metrics(dead, "pipeline", "run-1", interval_s=0.05):
        metrics.get().stage_runs.labels("ingest", "ran").inc()
        failures = metrics.get().push_failures
        pushes_before_end = failures._value.get()
    warnings = [r for r in caplog.records if "Pushgateway" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert pushes_before_end >= 1  # the first push, at the start
    assert failures._value.get() >= pushes_before_end + 2  # the final push and the outcome's, counted
    assert not metrics.enabled()  # back to off after the flow run


def test_a_failed_push_returns_false_and_is_counted():
    registry = metrics.enable(fresh=True)
    pusher = Pusher(f"127.0.0.1:{free_port()}", registry, {"flow": "rl", "flow_run": "r"})
    assert pusher.push() is False
    assert metrics.get().push_failures._value.get() == 1


def test_no_gateway_means_no_metrics():
    with flow_metrics(None, "pipeline", "run-1"):
        assert metrics.get() is OFF


def test_the_environment_variable_overrides_the_setting(monkeypatch):
    monkeypatch.delenv(metrics.ENV_PUSHGATEWAY, raising=False)
    assert MetricsConfig().gateway() is None
    assert MetricsConfig(pushgateway="pgw:9091").gateway() == "pgw:9091"
    monkeypatch.setenv(metrics.ENV_PUSHGATEWAY, "other:9091")
    assert MetricsConfig(pushgateway="pgw:9091").gateway() == "other:9091"


def test_the_metrics_setting_never_changes_a_digest():
    on = PipelineConfig(metrics=MetricsConfig(pushgateway="pgw:9091", push_interval_s=1, serve_port=9464))
    assert "metrics" not in PipelineConfig().digest_config()
    assert on.digest_config() == PipelineConfig().digest_config()


def test_a_verdict_counts_its_outcome_latency_and_suspicious_kind():
    from codemill.sandbox.judge_pool import Judged, count_verdict
    from codemill.sandbox.runner import Outcome

    registry = metrics.enable(fresh=True)
    count_verdict(metrics.get(), Judged(Outcome.FAILED, False, 0.0, "candidate_gone", "", 0.2, {}))
    count_verdict(metrics.get(), Judged(Outcome.PASSED, True, 1.0, "passed", "", 0.01, {}))
    value = registry.get_sample_value
    assert value("codemill_sandbox_verdicts_total", {"outcome": "failed"}) == 1
    assert value("codemill_sandbox_verdicts_total", {"outcome": "passed"}) == 1
    assert value("codemill_sandbox_suspicious_samples_total", {"kind": "exited"}) == 1
    assert value("codemill_sandbox_verdict_seconds_count") == 2
    assert value("codemill_sandbox_verdict_seconds_bucket", {"le": "0.25"}) == 2
