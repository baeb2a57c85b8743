"""The eval suites, by name. A suite is one module here that defines ``SUITE`` (``base.Suite``, which names its
config section, ``evaluate.<name>``), and its name in ``SUITE_MODULES`` below; the evaluate section, planning,
the evaluate stage, the gate, ``codemill compare`` and the seed-noise calibration find it through this
registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from codemill.evals.stats import ItemScores
from codemill.evals.suites.base import (
    DEFAULT_HOLD_MARGIN,
    EvalModel,
    Metric,
    Suite,
    SuiteRun,
    load_eval_model,
    load_val_files,
    sampler_config,
)
from codemill.registry import plugins

if TYPE_CHECKING:
    from codemill.evals.config import EvalConfig  # the section built from this registry

SUITE_MODULES = ("bpb", "completion", "humaneval", "humaneval_infilling", "latency", "repo_tasks", "completion_syntax")
REGISTRY: dict[str, Suite] = {s.name: s for s in plugins(__name__, SUITE_MODULES, "SUITE")}
SUITE_VERSIONS: dict[str, str] = {name: s.code_version for name, s in REGISTRY.items()}
# Which suite's rows a gate metric is scored from.
SUITE_OF_METRIC: dict[str, str] = {m.name: s.name for s in REGISTRY.values() for m in s.metrics}
# Every metric a suite reports, by name: its unit, direction and hold margin.
METRICS: dict[str, Metric] = {m.name: m for s in REGISTRY.values() for m in s.metrics}

__all__ = ["DEFAULT_HOLD_MARGIN", "METRICS", "REGISTRY", "SUITE_OF_METRIC", "SUITE_VERSIONS", "EvalModel", "Metric",
           "Suite", "SuiteRun", "get", "hold_margin", "item_scores", "load_eval_model", "load_val_files", "rows_file",
           "sampler_config", "samples_with_vllm"]


def get(name: str) -> Suite:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; known: {', '.join(REGISTRY)}") from None


def hold_margin(metric: str) -> float:
    """The hold margin ``metric`` declares (``Metric.hold_margin``), the default for a metric no suite reports."""
    known = METRICS.get(metric)
    return known.hold_margin if known is not None else DEFAULT_HOLD_MARGIN


def samples_with_vllm(cfg: EvalConfig) -> bool:
    """Whether an evaluation on ``cfg`` starts a vLLM engine: ``engine: vllm`` and a suite that generates."""
    return cfg.engine == "vllm" and any(get(s).generates for s in cfg.suites)


def rows_file(suite: str) -> str:
    """Where an evaluate artifact keeps its per-item rows (relative to the artifact): the gate, the lineage
    comparison and the MLflow run all read this one file."""
    return f"rows/{suite}.parquet"


def item_scores(suite: str, rows: pl.DataFrame) -> dict[str, ItemScores]:
    """The gate's view of a suite's rows: metric -> per-item scores."""
    return get(suite).item_scores(rows)
