"""A real Pushgateway and a real Prometheus for the metrics tests: Debian's `prometheus-pushgateway` and
`prometheus` (.ci/run installs them), on free ports with their data in a temporary folder, Prometheus scraping
every second with the shipped scrape configuration (deployments/monitoring/prometheus.yml, targets replaced) and
the shipped rules."""

from __future__ import annotations

import json
import math
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import free_port
from tests.system_tools import require

MONITORING = Path(__file__).resolve().parents[2] / "deployments" / "monitoring"


@dataclass
class Monitoring:
    pushgateway: str  # host:port, as `metrics.pushgateway` takes it
    prometheus: str  # base URL

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (raises on a PromQL error, with Prometheus's message)."""
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            raise ValueError(f"{expr}: {e.read().decode()}") from None
        return body["data"]["result"] if body["data"]["resultType"] == "vector" else [
            {"metric": {}, "value": body["data"]["result"]}]

    def values(self, expr: str, by: str | None = None) -> dict[str, float]:
        """The query's values, keyed by the label ``by`` (or "" when there is none)."""
        rows = self.query(expr)
        out = {row["metric"].get(by, "") if by else "": float(row["value"][1]) for row in rows}
        if len(out) != len(rows):
            raise ValueError(f"{expr}: {len(rows)} series for {len(out)} keys: {[r['metric'] for r in rows]}")
        return out

    def wait_for(self, expr: str, ok: Callable[[dict[str, float]], bool] = bool, timeout: float = 60) -> dict:
        """The query's values once ``ok`` holds for them (Prometheus scrapes every second)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.values(expr)
            if ok(got) or time.monotonic() > deadline:
                return got
            time.sleep(0.5)


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not become ready")


def prometheus_config(pushgateway: str, serve: str) -> dict[str, Any]:
    """The shipped prometheus.yml with this test's targets, a 1 s scrape and evaluation interval, the shipped
    rules by absolute path."""
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(MONITORING / f) for f in config["rule_files"]]
    targets = {"pushgateway": pushgateway, "codemill-serve": serve}
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
    return config


@contextmanager
def running_monitoring(root: Path, serve: str) -> Iterator[Monitoring]:
    """A Pushgateway and a Prometheus scraping it and ``serve`` (a /metrics endpoint), stopped afterwards. Skips
    (or fails under ``.ci/run``) where either program is missing, for every test that starts them."""
    require("pushgateway")
    require("prometheus")
    procs: list[subprocess.Popen] = []
    try:
        pgw = f"127.0.0.1:{free_port()}"
        # Debian's build persists to /var/lib/prometheus by default: this one keeps its groups in memory only
        procs.append(subprocess.Popen(["prometheus-pushgateway", f"--web.listen-address={pgw}", "--persistence.file="],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_ready(f"http://{pgw}/-/ready", procs[-1])
        prom = f"127.0.0.1:{free_port()}"
        (root / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(pgw, serve)))
        (root / "data").mkdir()
        procs.append(subprocess.Popen(["prometheus", f"--config.file={root / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address={prom}"],
                                      stdout=subprocess.DEVNULL, stderr=(root / "prometheus.log").open("w")))
        _wait_ready(f"http://{prom}/-/ready", procs[-1])
        yield Monitoring(pgw, f"http://{prom}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def finite(values: dict[str, float]) -> bool:
    return bool(values) and all(math.isfinite(v) for v in values.values())
