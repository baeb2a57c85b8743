"""Every metric codemill exports, in one place: name, help text and labels.

Names follow the Prometheus conventions (``codemill_`` prefix, base units, ``_seconds``, ``_bytes``,
``_total`` for counters). Labels take values from small fixed sets (stage, suite, outcome, reason, kind, rank,
flow), never a sample, file or problem, so a series count stays bounded however long codemill runs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# A sandbox verdict takes milliseconds (a trivial sample) to the wall-clock limit (seconds).
VERDICT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
COMMIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(frozen=True)
class Metrics:
    """The metric objects of one registry (or, when metrics are off, no-op stand-ins with the same methods)."""

    # pipeline
    stage_runs: Any
    stage_wall_seconds: Any
    stage_cpu_seconds: Any
    stage_gpu_seconds: Any
    artifacts_committed: Any
    artifact_bytes: Any
    flow_runs: Any
    flow_finished: Any
    mlflow_unreachable: Any
    server_retries: Any
    push_failures: Any
    # ingest
    ingest_files: Any
    ingest_bytes: Any
    ingest_rejected_files: Any
    ingest_chunks: Any
    # training (rank 0)
    train_steps: Any
    train_tokens_per_second: Any
    train_loss: Any
    train_grad_norm: Any
    train_learning_rate: Any
    train_mfu: Any
    checkpoint_commit_seconds: Any
    # rollouts and RL iterations
    rollout_samples: Any
    rollout_tokens: Any
    rollout_generation_seconds: Any
    rollout_reward_seconds: Any
    rollout_samples_in_flight: Any
    rollout_episodes: Any
    rl_iteration: Any
    rl_reward_mean: Any
    rl_pass_rate: Any
    rl_zero_variance_groups: Any
    # sandbox / judge pool
    sandbox_slots_busy: Any
    sandbox_slots: Any
    sandbox_verdict_seconds: Any
    sandbox_verdicts: Any
    sandbox_suspicious_samples: Any
    sandbox_server_restarts: Any
    sandbox_probe_failures: Any
    # evaluation and the gate
    eval_suite_wall_seconds: Any
    gate_verdicts: Any


def build(registry: CollectorRegistry) -> Metrics:
    """The metrics, registered on ``registry``."""

    def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, labels, registry=registry)

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=registry)

    def histogram(name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, labels, registry=registry, buckets=buckets)

    return Metrics(
        stage_runs=counter("codemill_stage_runs_total", "Stage runs by result: ran (produced now), present (its "
                           "artifact was in the store), cached (Prefect's cache), failed.", ("stage", "result")),
        stage_wall_seconds=counter("codemill_stage_wall_seconds_total", "Wall time of produced stages.",
                                   ("stage",)),
        stage_cpu_seconds=counter("codemill_stage_cpu_seconds_total", "CPU time (process and waited-for children) "
                                  "of produced stages.", ("stage",)),
        stage_gpu_seconds=counter("codemill_stage_gpu_seconds_total", "GPUs held times wall time of produced "
                                  "stages.", ("stage",)),
        artifacts_committed=counter("codemill_artifacts_committed_total", "Artifacts committed to the store.",
                                    ("stage",)),
        artifact_bytes=counter("codemill_artifact_bytes_total", "Payload bytes of committed artifacts.",
                               ("stage",)),
        flow_runs=counter("codemill_flow_runs_total", "Flow runs that ended, by result (succeeded, failed).",
                          ("flow", "result")),
        flow_finished=gauge("codemill_flow_run_finished_timestamp_seconds", "When this flow run ended (Unix "
                            "time); absent while it runs.", ("flow",)),
        mlflow_unreachable=counter("codemill_mlflow_unreachable_total", "Flow runs that could not reach the "
                                   "MLflow tracking server at their start."),
        server_retries=counter("codemill_server_retries_total", "Stage retries because a server (MLflow, the "
                               "store) did not answer."),
        push_failures=counter("codemill_metrics_push_failures_total", "Pushes to the Pushgateway that failed."),
        ingest_files=counter("codemill_ingest_files_total", "Files read by ingest, by result (kept, rejected).",
                             ("result",)),
        ingest_bytes=counter("codemill_ingest_bytes_total", "Bytes of the files read by ingest."),
        ingest_rejected_files=counter("codemill_ingest_rejected_files_total", "Files rejected by ingest, by "
                                      "reason.", ("reason",)),
        ingest_chunks=counter("codemill_ingest_chunks_total", "Ingest chunks, by whether an earlier run's "
                                     "result was reused (reused, processed).", ("result",)),
        train_steps=counter("codemill_train_steps_total", "Optimizer steps (rank 0).", ("rank",)),
        train_tokens_per_second=gauge("codemill_train_tokens_per_second", "Training throughput, all ranks.",
                                      ("rank",)),
        train_loss=gauge("codemill_train_loss", "Training loss at the last logged step.", ("rank",)),
        train_grad_norm=gauge("codemill_train_grad_norm", "Gradient norm before clipping, last logged step.",
                              ("rank",)),
        train_learning_rate=gauge("codemill_train_learning_rate", "Learning rate at the last logged step.",
                                  ("rank",)),
        train_mfu=gauge("codemill_train_mfu_ratio", "Model FLOPs utilisation (GPU only).", ("rank",)),
        checkpoint_commit_seconds=histogram("codemill_checkpoint_commit_seconds", "Checkpoint save to commit.",
                                            ("rank",), COMMIT_BUCKETS),
        rollout_samples=counter("codemill_rollout_samples_total", "Samples generated by rollouts."),
        rollout_tokens=counter("codemill_rollout_tokens_total", "Completion tokens generated by rollouts."),
        rollout_generation_seconds=counter("codemill_rollout_generation_seconds_total", "Time spent generating "
                                           "rollouts."),
        rollout_reward_seconds=counter("codemill_rollout_reward_seconds_total", "Time spent judging rollouts "
                                       "(the environment)."),
        rollout_samples_in_flight=gauge("codemill_rollout_samples_in_flight", "Samples of the batches being "
                                        "generated or judged."),
        rollout_episodes=counter("codemill_rollout_episodes_total", "Rollout episodes by outcome.", ("outcome",)),
        rl_iteration=gauge("codemill_rl_iteration", "The RL iteration whose rollouts were collected last."),
        rl_reward_mean=gauge("codemill_rl_reward_mean", "Mean reward of the last rollouts, by split.", ("split",)),
        rl_pass_rate=gauge("codemill_rl_pass_rate", "Pass rate of the last rollouts, by split.", ("split",)),
        rl_zero_variance_groups=gauge("codemill_rl_zero_variance_groups", "Groups of the last rollouts whose "
                                      "samples all got the same reward (no GRPO signal).", ("split",)),
        sandbox_slots_busy=gauge("codemill_sandbox_slots_busy", "Sandbox slots (judge pools, batch runners) busy now."),
        sandbox_slots=gauge("codemill_sandbox_slots", "Sandbox slots (judge pools, batch runners) open."),
        sandbox_verdict_seconds=histogram("codemill_sandbox_verdict_seconds", "Time from sending a sample to "
                                          "its verdict.", (), VERDICT_BUCKETS),
        sandbox_verdicts=counter("codemill_sandbox_verdicts_total", "Verdicts by outcome (passed, failed, "
                                 "timed_out, killed_memory).", ("outcome",)),
        sandbox_suspicious_samples=counter("codemill_sandbox_suspicious_samples_total", "Samples that deserve a "
                                           "look, by kind (timed_out, killed, exited, no_verdict, ...).", ("kind",)),
        sandbox_server_restarts=counter("codemill_sandbox_server_restarts_total", "Sandbox servers replaced "
                                        "after dying or hanging."),
        sandbox_probe_failures=counter("codemill_sandbox_probe_failures_total", "Sandbox probes or server starts "
                                       "that failed (the pool fails closed)."),
        eval_suite_wall_seconds=gauge("codemill_eval_suite_wall_seconds", "Wall time of the last run of a suite.",
                                      ("suite",)),
        gate_verdicts=counter("codemill_gate_verdicts_total", "Gate verdicts by result (promote, hold, regression).",
                              ("result",)),
    )


class _Off:
    """What every metric is when metrics are off: each call does nothing and returns at once."""

    def labels(self, *args: Any, **kwargs: Any) -> _Off:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


OFF = Metrics(**{f.name: _Off() for f in fields(Metrics)})
