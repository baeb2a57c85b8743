"""What an update rule gives the RL loop: the settings its policy artifact hashes, and the job that computes the
update (a torchrun module with its spec) from the iteration's inputs. The ``rl`` flow plans, launches and records;
the rule decides what runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel

from codemill.stage_config import StageConfig

if TYPE_CHECKING:
    from codemill.models.config import TrainConfig
    from codemill.rl.config import RLConfig


class AlgorithmSettings(StageConfig):
    """The base of an update rule's config (its module declares it beside the rule; each narrows ``name`` to
    its ``Literal``, the field the rl section's union is discriminated on). ``multi_turn``: whether the rule trains
    through the loss mask, so episodes with environment tokens are fine."""

    name: str
    multi_turn: ClassVar[bool] = True

    def check_rl(self, rl: RLConfig) -> None:
        """Raise ValueError when the rl section cannot run this rule (any can, unless the rule says)."""


@dataclass(frozen=True)
class UpdateInputs:
    """One update's inputs, as paths: the sampling policy, the iteration's rollouts, the previous update's
    artifact (None at the start), where the new policy goes (``out_dir/hf``) and a scratch folder for resume."""

    rl: RLConfig
    train: TrainConfig
    config: dict[str, Any]  # the plan's hashed config (update_config's result)
    policy_hf: str
    rollouts_path: Path
    rollouts_name: str
    rollouts_digest: str
    previous: Path | None
    reference_hf: str | None
    out_dir: Path
    scratch: Path


@dataclass
class UpdateJob:
    """A torchrun job: ``module`` with ``spec`` as its JSON argument, launched with ``launch``'s processes,
    device and timeout; ``result()`` reads what it wrote into the policy manifest's stats. ``served``: the job
    goes to the run's long-lived update workers (``rl.update_workers``) instead of a torchrun of its own."""

    spec: BaseModel
    launch: Any  # GRPOConfig | TrainConfig: nproc_per_node, device, timeout_s
    module: str
    result: Callable[[], dict[str, Any]]
    served: bool = False


class Algorithm(Protocol):
    name: ClassVar[str]
    settings: ClassVar[type[AlgorithmSettings]]

    def update_config(self, rl: RLConfig, train: TrainConfig, iteration: int, seed: int) -> dict[str, Any]:
        """The settings the policy artifact of iteration ``iteration`` hashes (``seed``: the update's own)."""
        ...

    def launch_config(self, rl: RLConfig, train: TrainConfig) -> Any:
        """Where the update runs: an object with ``nproc_per_node``, ``device`` and ``timeout_s``."""
        ...

    def job(self, inputs: UpdateInputs) -> UpdateJob | dict[str, Any]:
        """The job to run, or the stats of an update that needed none (the policy goes on unchanged)."""
        ...
