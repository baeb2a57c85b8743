"""The Grafana dashboards in deployments/monitoring: provisioned from their folder, every panel on the
`datasource` variable, and every series they query one that codemill exports or the rules record (a renamed
metric would otherwise leave a panel silently empty). tests/integration/test_metrics.py runs the expressions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from codemill.metrics.definitions import build

MONITORING = Path(__file__).resolve().parents[2] / "deployments" / "monitoring"
DASHBOARDS = sorted((MONITORING / "grafana" / "dashboards").glob("*.json"))
# Series that exist outside codemill/metrics/definitions.py: pushed by the flow-outcome group, and Prometheus's own.
OTHER_SERIES = {"codemill_flow_last_success_timestamp_seconds", "codemill_flow_last_failure_timestamp_seconds"}


def exported_series() -> set[str]:
    registry = CollectorRegistry()
    build(registry)
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    names = {family.name + suffix for family in registry.collect() for suffix in suffixes[family.type]}
    groups = yaml.safe_load((MONITORING / "rules.yml").read_text())["groups"]
    return names | {r["record"] for g in groups for r in g["rules"] if "record" in r} | OTHER_SERIES


def test_the_four_dashboards_are_provisioned_from_their_folder():
    assert [p.stem for p in DASHBOARDS] == ["pipeline", "rl", "sandbox", "training"]
    provider = yaml.safe_load((MONITORING / "grafana" / "provisioning" / "dashboards" / "codemill.yaml").read_text())
    assert provider["providers"][0]["type"] == "file"
    assert len({json.loads(p.read_text())["uid"] for p in DASHBOARDS}) == len(DASHBOARDS)


def test_every_panel_queries_known_series_on_the_datasource_variable():
    known = exported_series()
    unknown = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert any(v["name"] == "datasource" for v in board["templating"]["list"])
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
            for target in panel["targets"]:
                names = set(re.findall(r"\bcodemill[a-z0-9_:]*", target["expr"]))
                assert names, f"{path.stem}: {panel['title']}: queries no codemill series"
                unknown += [f"{path.stem}: {panel['title']}: {n}" for n in names - known]
    assert not unknown, "\n".join(unknown)
