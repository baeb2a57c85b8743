"""Metrics end to end: a short pipeline and a short RL flow push to a real Pushgateway that a real Prometheus
scrapes (tests/integration/monitoring.py), and PromQL against that Prometheus sees what the runs did: stage runs
as the flows' summaries have them, verdicts and outcomes as the rollouts tables have them, the training steps,
the gate verdict, the last success. Every expression of every shipped Grafana dashboard parses there and returns
data wherever its series exist."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pyarrow.parquet as pq
import pytest

from codemill.metrics.config import MetricsConfig
from codemill.store import ArtifactStore
from tests.conftest import free_port
from tests.integration.helpers import small_pipeline_config
from tests.integration.monitoring import MONITORING, Monitoring, finite, running_monitoring
from tests.integration.rl_setup import rl_config
from tests.tiny_policy import make_policy

pytestmark = [pytest.mark.integration, pytest.mark.system_tool("prometheus", "pushgateway"),
              pytest.mark.usefixtures("prefect_harness")]
DASHBOARDS = sorted((MONITORING / "grafana" / "dashboards").glob("*.json"))
# Grafana's built-in variables, as a dashboard query gets them (the test's data spans minutes).
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
# Cheapest RL that reaches every rollout metric: 1 iteration, 4 problems x 2 samples, a 1-rank GRPO update.
RL_SETTINGS: dict[str, Any] = {
    "iterations": 1, "heldout_samples": 1,
    "rollout": {"problems_per_iteration": 4, "samples_per_problem": 2, "max_new_tokens": 8, "workers": 2},
    "algorithm": {"name": "grpo", "nproc_per_node": 1, "device": "cpu", "micro_batch_size": 4},
}


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory) -> Monitoring:
    """Pushgateway + Prometheus, and a process serving /metrics as `codemill serve` does (one more target)."""
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-c", "import time; from codemill.metrics.http import serve_metrics; "
                              f"serve_metrics({port}, '127.0.0.1'); time.sleep(3600)"])
    try:
        with running_monitoring(tmp_path_factory.mktemp("monitoring"), f"127.0.0.1:{port}") as mon:
            yield mon
    finally:
        serve.terminate()
        serve.wait(timeout=30)


def _metrics_on(mon: Monitoring) -> MetricsConfig:
    return MetricsConfig(pushgateway=mon.pushgateway, push_interval_s=1.0)


@pytest.fixture(scope="module")
def runs(monitoring, small_corpus, tmp_path_factory) -> dict[str, Any]:
    """A short pipeline (3 training steps, two small suites, the gate), the same again on another MLflow (every
    stage present in the store), then the problems flow and a one-iteration RL flow, all pushing; returns their
    results once Prometheus has scraped the RL run's final push."""
    from codemill.flows.pipeline import pipeline
    from codemill.flows.problems import problems
    from codemill.flows.rl import rl

    started = time.time()
    cfg = small_pipeline_config(small_corpus, tmp_path_factory.mktemp("metrics-pipeline"), max_steps=3)
    cfg.evaluate.suites = ["bpb", "completion"]
    cfg.evaluate.bpb.max_files, cfg.evaluate.completion.max_files = 12, 8
    cfg.evaluate.completion.max_new_tokens, cfg.evaluate.bootstrap_samples = 8, 100
    cfg.metrics = _metrics_on(monitoring)
    out = {"pipeline": pipeline(config=cfg), "started": started}
    again = cfg.model_copy(deep=True)  # another tracking server: Prefect's cache misses, the store has every stage
    again.mlflow_tracking_uri = cfg.mlflow_tracking_uri.replace("mlflow.db", "mlflow-again.db")
    out["pipeline again"] = pipeline(config=again)

    root = tmp_path_factory.mktemp("metrics-rl")
    rl_cfg = rl_config(root, **RL_SETTINGS)
    rl_cfg.problems.sources[0].count = 40
    rl_cfg.metrics = _metrics_on(monitoring)
    problems(config=rl_cfg)
    out["rl"] = rl(config=rl_cfg, model=str(make_policy(root / "start")))
    out["store"] = ArtifactStore(rl_cfg.store_root)
    monitoring.wait_for('codemill_flow_runs_total{flow="rl"}')
    return out


def _rollout_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    store = out["store"]
    rows = []
    for stage in out["rl"]["stages"].values():
        if stage["ref"]["stage"] == "rollouts":
            ref = store.ref("rollouts", stage["ref"]["name"], stage["ref"]["digest"])
            rows += pq.read_table(store.local_path(ref) / "rollouts.parquet").to_pylist()
    return rows


def of_run(runs: dict[str, Any], flow: str, expr: str) -> str:
    """``expr`` with ``RUN`` in its label matchers standing for that flow run's group."""
    return expr.replace("RUN", f'flow_run="{runs[flow]["flow_run_id"]}"')


@pytest.mark.parametrize("flow", ["pipeline", "pipeline again", "rl"])
def test_stage_runs_equal_the_flow_summary(monitoring, runs, flow):
    """Stages that ran, were found in the store (the second pipeline) or in Prefect's cache (the RL flow's
    problems), each counted as the flow's summary has it."""
    expected = Counter(f"{s['ref']['stage']} {s['status']}" for s in runs[flow]["stages"].values())
    got = {f"{r['metric']['stage']} {r['metric']['result']}": float(r["value"][1]) for r in monitoring.query(
        of_run(runs, flow, "sum by (stage, result) (codemill_stage_runs_total{RUN})"))}
    assert got == {k: float(v) for k, v in expected.items()}


def test_what_produced_stages_cost_and_committed(monitoring, runs):
    ran = {s["ref"]["stage"] for s in runs["pipeline"]["stages"].values() if s["status"] == "ran"}
    committed = monitoring.values(of_run(runs, "pipeline", "codemill_artifact_bytes_total{RUN} > 0"), by="stage")
    assert set(committed) == ran
    assert finite(monitoring.values(of_run(runs, "pipeline", "codemill_stage_cpu_seconds_total{RUN} > 0"),
                                    by="stage"))
    ingest = next(s for s in runs["pipeline"]["stages"].values() if s["ref"]["stage"] == "ingest")
    assert monitoring.values(of_run(runs, "pipeline", "codemill_ingest_files_total{RUN}"), by="result")["kept"] == \
        ingest["summary"]["files"]


def test_training_rank_zero_pushes_its_steps_and_loss(monitoring, runs):
    """The trainer's rank 0 pushes to its flow run's group, ``rank`` added; so does the GRPO update's."""
    assert monitoring.values(of_run(runs, "pipeline", 'codemill_train_steps_total{RUN, rank="0"}')) == {"": 3.0}
    loss = monitoring.values(of_run(runs, "pipeline", 'codemill_train_loss{RUN, rank="0"}'))
    assert finite(loss) and 0 < loss[""] < 20
    assert monitoring.values(of_run(runs, "pipeline", "codemill_train_tokens_per_second{RUN} > 0"))
    # the GRPO update's rank 0 pushed its group too (this one skipped: no group had distinct rewards)
    assert monitoring.values(of_run(runs, "rl", 'count(codemill_metrics_push_failures_total{RUN, rank="0"})')) == \
        {"": 1.0}


def test_the_run_end_is_recorded(monitoring, runs):
    ended = monitoring.values(of_run(runs, "pipeline", "codemill_flow_runs_total{RUN}"), by="result")
    assert ended == {"succeeded": 1.0}
    assert monitoring.values(of_run(runs, "pipeline", "sum(codemill_gate_verdicts_total{RUN})")) == {"": 1.0}
    last = monitoring.values('codemill_flow_last_success_timestamp_seconds{flow="pipeline"}')[""]
    assert runs["started"] <= last <= time.time()
    assert monitoring.values("sum(codemill_metrics_push_failures_total)") == {"": 0.0}
    assert monitoring.values('sum(codemill_mlflow_unreachable_total{flow="pipeline"})') == {"": 0.0}


def test_verdicts_and_outcomes_equal_the_rollouts_tables(monitoring, runs):
    rows = _rollout_rows(runs)
    rejudged = sum(s["summary"]["timings"]["rejudged"] for s in runs["rl"]["stages"].values()
                   if s["ref"]["stage"] == "rollouts")
    assert rows
    assert monitoring.values('sum(codemill_sandbox_verdicts_total{flow="rl"})') == {"": len(rows) + rejudged}
    assert monitoring.values('codemill_rollout_episodes_total{flow="rl"}', by="outcome") == \
        {k: float(v) for k, v in Counter(r["outcome"] for r in rows).items()}
    assert monitoring.values('codemill_rollout_samples_total{flow="rl"}') == {"": float(len(rows))}
    assert monitoring.values('codemill_rollout_tokens_total{flow="rl"}') == \
        {"": float(sum(len(r["completion_ids"]) for r in rows))}
    if rejudged == 0:  # a sample judged twice counts its first verdict's kind too
        suspicious = Counter(r["suspicious"] for r in rows if r["suspicious"])
        assert monitoring.values('codemill_sandbox_suspicious_samples_total{flow="rl"}', by="kind") == \
            {k: float(v) for k, v in suspicious.items()}
    assert monitoring.values('codemill_sandbox_slots{flow="rl"}') == {"": 0.0}  # every pool closed
    assert monitoring.values('codemill_rollout_samples_in_flight{flow="rl"}') == {"": 0.0}
    pass_rate = monitoring.values('codemill_rl_pass_rate{flow="rl"}', by="split")
    assert set(pass_rate) == {"train", "val"} and all(0 <= v <= 1 for v in pass_rate.values())


def test_the_serving_process_is_scraped(monitoring, runs):
    assert monitoring.values('up{job="codemill-serve"}') == {"": 1.0}
    assert monitoring.values('codemill_sandbox_slots{job="codemill-serve"}') == {"": 0.0}


def _expressions() -> list[tuple[str, str]]:
    out = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            out += [(f"{path.stem}: {panel['title']}", t["expr"]) for t in panel["targets"]]
    return out


def _selectors(expr: str) -> list[str]:
    """The series selectors of an expression (metric name and label matchers)."""
    return re.findall(r"\b(?:codemill[a-z0-9_:]*|up|push_time_seconds)(?:\{[^}]*\})?", expr)


def test_every_dashboard_expression_parses_and_has_data_where_its_series_exist(monitoring, runs):
    assert len(DASHBOARDS) == 4
    empty = []
    for where, expr in _expressions():
        for var, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(var, value)
        result = monitoring.query(expr)  # a PromQL error raises
        if not result and all(monitoring.query(f"count({s})") for s in _selectors(expr)):
            empty.append(f"{where}: {expr}")
    assert not empty, "no data although every series exists:\n" + "\n".join(empty)
