"""What a training process's rank 0 records per step, shared by the trainer (SFT) and the GRPO update."""

from __future__ import annotations

from codemill import metrics

RANK = "0"  # only rank 0 reports: its values stand for the job


def count_step() -> None:
    metrics.get().train_steps.labels(RANK).inc()


def record_step(loss: float, grad_norm: float, lr: float, tokens_per_s: float | None = None,
                mfu: float | None = None) -> None:
    """A logged step's values as gauges (no-ops when metrics are off)."""
    m = metrics.get()
    m.train_loss.labels(RANK).set(loss)
    m.train_grad_norm.labels(RANK).set(grad_norm)
    m.train_learning_rate.labels(RANK).set(lr)
    if tokens_per_s is not None:
        m.train_tokens_per_second.labels(RANK).set(tokens_per_s)
    if mfu is not None:
        m.train_mfu.labels(RANK).set(mfu)


def record_checkpoint_commit(seconds: float) -> None:
    metrics.get().checkpoint_commit_seconds.labels(RANK).observe(seconds)
