"""The ``gate`` section of the pipeline config: which metrics the gate tests, their margins, the error rate and
the registered model whose alias names the champion."""

from __future__ import annotations

from pydantic import Field

from codemill.stage_config import StageConfig


class GateMetricConfig(StageConfig):
    name: str = Field(description="Eval metric: val_bpb, completion_exact_match, completion_edit_similarity, "
                                  "humaneval_pass_at_1, humaneval_plus_pass_at_1, humaneval_infilling_pass_at_1, "
                                  "repo_tasks_resolved, latency_ttft_ms, latency_per_token_ms (milliseconds, lower "
                                  "is better; margin in ms).")
    margin: float = Field(0.0, ge=0, description="Tolerated loss before a difference counts as a regression.")
    uncalibrated_margin: float | None = Field(
        None, ge=0, description="With no seed-noise calibration of the champion's config (codemill calibrate), "
        "a difference smaller than this is a hold; empty = the margin derived from the nearest shipped preset's "
        "seed noise, never below the metric's floor (its suite's Metric.hold_margin).")


class GateConfig(StageConfig):
    enabled: bool = Field(True, description="Compare with the champion and promote on a 'promote' verdict.")
    registered_model: str | None = Field(None, description="MLflow registered model; empty = experiment name.")
    alias: str = Field("champion", description="MLflow registered-model alias naming the champion: compared "
                                               "with, and moved to the new version on a promotion.")
    alpha: float = Field(0.05, gt=0, lt=1, description="Family-wise error rate (Holm) of each test family.")
    metrics: list[GateMetricConfig] = Field(
        default_factory=lambda: [GateMetricConfig(name="val_bpb", margin=0.01),
                                 GateMetricConfig(name="completion_edit_similarity", margin=0.02),
                                 GateMetricConfig(name="humaneval_pass_at_1", margin=0.02),
                                 GateMetricConfig(name="humaneval_infilling_pass_at_1", margin=0.02)],
        description="Metrics the gate tests; those of suites not run are skipped.")
