"""The alert rules in deployments/monitoring: valid for Prometheus 2.42's promtool, and every alert unit-tested
(`promtool test rules`) on series that should fire it and on series that should not; the PrometheusRule carries
the same groups; each alert's runbook line exists in the docs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deployments" / "monitoring"
RULES, RULE_TESTS = MONITORING / "rules.yml", MONITORING / "rules.test.yml"
promtool = pytest.mark.system_tool("prometheus")


def _alerts() -> dict[str, dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=MONITORING, capture_output=True, text=True, timeout=120)


@promtool
def test_rules_pass_promtool_check():
    done = _promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr


@promtool
def test_alert_unit_tests_pass():
    done = _promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_silent():
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    fires = {c["alertname"] for c in cases if c["exp_alerts"]}
    silent = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert fires == set(_alerts()), f"alerts without a firing test: {set(_alerts()) - fires}"
    assert silent == set(_alerts()), f"alerts without a silent test: {set(_alerts()) - silent}"


def test_prometheusrule_carries_the_same_groups():
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_every_alert_has_a_runbook_line_in_the_docs():
    docs = (ROOT / "docs" / "observability.md").read_text()
    for name, rule in _alerts().items():
        assert rule["annotations"]["runbook"] == f"docs/observability.md#{name.lower()}"
        section = re.search(rf"^### {name}\n\n(.+)$", docs, re.M)
        assert section and len(section[1]) > 40, f"docs/observability.md has no runbook line under '### {name}'"
