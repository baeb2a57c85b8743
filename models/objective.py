"""What a training objective gives the one training loop (``models.trainer.Trainer``).

The loop owns everything two objectives would otherwise both write: the process group, DDP / FSDP2, AdamW and its
schedule, micro-batching and gradient accumulation, clipping, checkpoint cadence and exact resume (refused when
the checkpoint's fingerprint is another run's), rank-0 logging (JSON lines, Prometheus, MLflow) and the done line.
An objective supplies what differs: the model it trains and how it leaves, the batches of each step, the loss of
a micro-batch and the metrics of a step (the shape of TRL's trainers: one loop, a loss and a batch builder per
algorithm; torchtitan's ``Trainer`` with its model, loss and data builders).

The objective pulls its batches: ``next_step`` hands over one optimizer step's micro-batches, or None when there
is no more work, so the loop never assumes a fixed dataset and a consumer of a queue of batches (asynchronous
RL) runs on it unchanged. Objectives: ``models.language_model.LanguageModeling`` (pretraining, fine-tuning,
rejection sampling) and ``rl.algorithms.grpo.GRPOObjective``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import torch

    from codemill.models.core import TrainingCore
    from codemill.models.parallel import Dist

B = TypeVar("B")


@dataclass(frozen=True)
class LoopSettings:
    """How the loop runs an objective: where, wrapped how, clipped how, checkpointed and logged how often."""

    device: str
    parallelism: str
    dtype: str
    grad_clip: float
    ckpt_dir: str
    keep_checkpoints: int
    checkpoint_every: int
    log_every: int = 1
    compile: bool = False
    async_checkpoint: bool = False  # honoured on CUDA only


@dataclass(frozen=True)
class Optimization:
    """AdamW and its learning-rate schedule (``models.schedule.lr_multiplier``'s arguments)."""

    lr: float
    beta1: float
    beta2: float
    weight_decay: float
    schedule: str
    warmup_steps: int
    total_steps: int
    min_lr_ratio: float = 1.0
    decay_fraction: float | None = None


@dataclass(frozen=True)
class RunPlan:
    """What the loop needs before it builds anything: the steps (None: until ``next_step`` says there are no more;
    0: nothing to train, so no model is built), the optimiser, and the fingerprint a checkpoint must carry to be
    resumed (None: not checked)."""

    total_steps: int | None
    optimization: Optimization
    fingerprint: str | None = None
    mismatch: str = "other inputs, config or world size"  # what a different fingerprint means, for the error


@dataclass
class Finished:
    """The run's summary (what the caller reads back) and the fields of the done line."""

    summary: dict[str, Any]
    done: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MicroBatches(Generic[B]):
    """One optimizer step's micro-batches on this rank, each read when its turn comes (one on the device at a
    time). Every rank gets the same count, so the ranks' collectives stay in step."""

    count: int
    read: Callable[[int], B]

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[B]:
        return (self.read(i) for i in range(self.count))


class Tracked(Protocol):
    """What a run's MLflow step metrics and checkpoints are logged against (its training data)."""

    @property
    def dataset_name(self) -> str: ...

    @property
    def dataset_digest(self) -> str | None: ...


class Objective(Protocol):
    """A training objective, in the order the loop calls it. Methods the docstrings call collectives run on every
    rank; the rest may too (only rank 0 logs what they return)."""

    @property
    def settings(self) -> LoopSettings: ...

    @property
    def tracked(self) -> Tracked | None:
        """What MLflow logs the steps and checkpoints against; None: no MLflow from the ranks."""
        ...

    @property
    def loss_metric(self) -> str:
        """The key of the loss in a step's record and logged metrics."""
        ...

    def open(self, d: Dist) -> RunPlan:
        """Read what the run trains on (every rank) and plan it."""
        ...

    def build_model(self, d: Dist) -> torch.nn.Module:
        """The model to train, on ``d.device``, before wrapping."""
        ...

    def attached(self, core: TrainingCore) -> None:
        """The model is wrapped and the optimiser built: load what goes beside them (a reference model, an
        optimiser state carried over), before a checkpoint is resumed."""
        ...

    def restore(self, saved: dict[str, Any]) -> None:
        """What ``checkpoint_state`` saved with the checkpoint being resumed."""
        ...

    def begin(self, start_step: int) -> dict[str, Any]:
        """The steps start at ``start_step``; the start line's fields."""
        ...

    def next_step(self, step: int) -> MicroBatches[Any] | None:
        """This rank's micro-batches of optimizer step ``step`` (0-based), or None: the run is over."""
        ...

    def loss(self, module: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, Any]:
        """A micro-batch's loss to backpropagate (scaled for accumulation), and what ``account`` reads after the
        backward pass."""
        ...

    def account(self, seen: Any) -> None:
        """Add a micro-batch's values to the step's metrics (after its backward pass)."""
        ...

    def end_step(self, step: int, grad_norm: float, lr: float) -> dict[str, Any]:
        """The step is applied (``lr``: the rate it ran at): its record, reduced over ranks (a collective)."""
        ...

    def logged(self, record: dict[str, Any]) -> dict[str, float]:
        """A logged step's metrics (rank 0, at the loop's cadence)."""
        ...

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out metrics of the weights after ``step`` steps ({} when there are none; a collective), before a
        checkpoint and at the end."""
        ...

    @property
    def best_step(self) -> int | None:
        """The step whose checkpoint survives pruning (the best held-out score), if any."""
        ...

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint saves beside the weights, optimiser, schedule and RNG (copies: a save may commit
        later)."""
        ...

    def finish(self, core: TrainingCore | None) -> Finished:
        """Export the result (collectives inside; rank 0 writes) and summarise. ``core`` None: the plan had no
        steps and no model was built."""
        ...
