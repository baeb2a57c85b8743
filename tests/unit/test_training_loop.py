"""The one training loop (``models.trainer.Trainer``) runs any objective that pulls its batches: one fed by a
bounded queue, with no step count known up front, trains until the queue closes, checkpoints on the loop's cadence
and computes what the same batches given as a list compute; a resumed run continues exactly; a checkpoint of another
run (another fingerprint) is refused. One rank, in process."""

from __future__ import annotations

import json
import queue
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from codemill.models.checkpoint import committed_steps
from codemill.models.core import TrainingCore
from codemill.models.objective import Finished, LoopSettings, MicroBatches, Optimization, RunPlan
from codemill.models.parallel import Dist
from codemill.models.trainer import run

Step = tuple[list[torch.Tensor], list[torch.Tensor]]  # one optimizer step: its micro-batches' inputs and targets
STEPS, EVERY = 5, 2


def _steps() -> list[Step]:
    g = torch.Generator().manual_seed(0)
    return [([torch.randn(3, 4, generator=g) for _ in range(m)], [torch.randn(3, 1, generator=g) for _ in range(m)])
            for m in (2, 1, 3, 2, 1)]  # micro-batches per step vary, as a queue's batches may


class Regression:
    """A linear model's mean squared error; its steps come from ``take(step)`` (None: no more)."""

    loss_metric = "loss"
    tracked = None
    best_step = None

    def __init__(self, take: Callable[[int], Step | None], ckpt_dir: Path, total: int | None,
                 fingerprint: str = "regression") -> None:
        self.take, self.total, self.fingerprint = take, total, fingerprint
        self.settings = LoopSettings("cpu", "ddp", "float32", grad_clip=1.0, ckpt_dir=str(ckpt_dir),
                                     keep_checkpoints=1, checkpoint_every=EVERY)
        self.losses: list[float] = []

    def open(self, d: Dist) -> RunPlan:
        return RunPlan(self.total, Optimization(0.05, 0.9, 0.95, 0.0, "wsd", 2, self.total or 0, min_lr_ratio=1.0),
                       self.fingerprint)

    def build_model(self, d: Dist) -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Linear(4, 1)

    def attached(self, core: TrainingCore) -> None:
        pass

    def restore(self, saved: dict[str, Any]) -> None:
        self.losses = list(saved["losses"])

    def begin(self, start_step: int) -> dict[str, Any]:
        return {}

    def next_step(self, step: int) -> MicroBatches[tuple[torch.Tensor, torch.Tensor]] | None:
        got = self.take(step)
        if got is None:
            return None
        xs, ys = got
        self.loss_sum, self.micros = 0.0, len(xs)
        return MicroBatches(len(xs), lambda m: (xs[m], ys[m]))

    def loss(self, module: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, Any]:
        x, y = batch
        loss = F.mse_loss(module(x), y) / self.micros  # the step's mean over its micro-batches
        return loss, loss

    def account(self, seen: Any) -> None:
        self.loss_sum += float(seen.detach())

    def end_step(self, step: int, grad_norm: float, lr: float) -> dict[str, Any]:
        self.losses.append(self.loss_sum)
        return {"loss": self.loss_sum, "grad_norm": grad_norm, "lr": lr}

    def logged(self, record: dict[str, Any]) -> dict[str, float]:
        return dict(record)

    def evaluate(self, step: int) -> dict[str, float]:
        return {}

    def checkpoint_state(self) -> dict[str, Any]:
        return {"losses": list(self.losses)}

    def finish(self, core: TrainingCore | None) -> Finished:
        assert core is not None
        return Finished({"losses": self.losses, "weight": core.model.weight.detach().clone()},
                        {"steps": len(self.losses)})


def _listed(steps: list[Step]) -> Callable[[int], Step | None]:
    return lambda step: steps[step] if step < len(steps) else None


@pytest.fixture(autouse=True)
def _deterministic_restored():
    """The loop turns deterministic algorithms on (CPU): restored after each test."""
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


def _events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_a_queue_fed_objective_trains_until_the_queue_closes(tmp_path, capsys):
    steps = _steps()
    feed: queue.Queue[Step | None] = queue.Queue(maxsize=1)  # the producer runs alongside the loop

    def produce() -> None:
        for s in steps:
            feed.put(s)
        feed.put(None)

    producer = threading.Thread(target=produce)
    producer.start()
    fed = run(Regression(lambda step: feed.get(timeout=60), tmp_path / "fed", total=None))
    producer.join()
    events = _events(capsys.readouterr().out)
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3, 4, 5]
    assert {e["max_steps"] for e in events if e["event"] == "step"} == {None}
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [2, 4]
    assert committed_steps(tmp_path / "fed") == [4]  # keep-last-1
    assert events[-1] == {"event": "done", "steps": STEPS}

    listed = run(Regression(_listed(steps), tmp_path / "listed", total=STEPS))
    assert fed["losses"] == listed["losses"] and len(fed["losses"]) == STEPS
    assert torch.equal(fed["weight"], listed["weight"])


def test_resume_continues_exactly_and_refuses_another_runs_checkpoint(tmp_path, capsys):
    steps = _steps()
    straight = run(Regression(_listed(steps), tmp_path / "straight", total=STEPS))
    assert committed_steps(tmp_path / "straight") == [4]
    shutil.copytree(tmp_path / "straight", tmp_path / "again")  # (this process still holds the first one's lock)
    capsys.readouterr()
    resumed = run(Regression(_listed(steps), tmp_path / "again", total=STEPS))
    events = _events(capsys.readouterr().out)
    assert {"event": "resumed", "step": 4} in events
    assert [e["step"] for e in events if e["event"] == "step"] == [5]
    assert resumed["losses"] == straight["losses"]
    assert torch.equal(resumed["weight"], straight["weight"])

    shutil.copytree(tmp_path / "straight", tmp_path / "other")
    with pytest.raises(RuntimeError, match="checkpoint of a different update"):
        run(Regression(_listed(steps), tmp_path / "other", total=STEPS, fingerprint="another run"))
