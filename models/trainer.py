"""The one training loop, and its torchrun entrypoint: ``python -m torch.distributed.run ... -m
codemill.models.trainer SPEC.json``.

``Trainer`` runs an objective (``models.objective``): it joins the process group, builds the objective's model,
wraps it (DDP or FSDP2 over gloo on CPU, nccl on CUDA), builds AdamW and the schedule, resumes the last committed
checkpoint (weights, optimizer, scheduler, RNG and the objective's state; refused when its fingerprint is another
run's), then for each step the objective hands over: the micro-batches' losses backpropagated with gradients
synced on the last, the clipped optimizer step, the step's record; rank 0 logs at the cadence (one JSON line,
the Prometheus gauges, MLflow when MLFLOW_RUN_ID is set), and a checkpoint (DCP, committed atomically) follows the
held-out evaluation every ``checkpoint_every`` steps before the last. Then the objective exports its result.

SPEC is the objective's spec: a ``TrainSpec`` here (the language-model objective, written by the train task); a
module whose objective takes another spec passes ``main`` its own (``rl.update`` for GRPO).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codemill.metrics.push import rank_pusher
from codemill.metrics.training import count_step, record_checkpoint_commit, record_step
from codemill.models import parallel
from codemill.models.common import emit, run_rank, start_rank
from codemill.models.core import TrainingCore
from codemill.models.language_model import LanguageModeling, TrainSpec, TrainState, write_export
from codemill.models.objective import Finished, MicroBatches, Objective, RunPlan, Tracked

if TYPE_CHECKING:
    from codemill.lineage import Lineage

# TrainSpec, TrainState and write_export are the language-model objective's: importable from the trainer that runs it
__all__ = ["RankZeroLogger", "TrainSpec", "TrainState", "Trainer", "main", "run", "train", "write_export"]


class RankZeroLogger:
    """MLflow from rank 0 only: step metrics, and each committed checkpoint as a LoggedModel.

    Logging is best effort: a tracking server that is briefly down costs a warning, never the training run
    (few, short HTTP retries; the train task registers the final model once the server is back).

    A checkpoint's LoggedModel is logged only once the checkpoint has committed (for an async save, after its
    upload), and it carries the step and the losses but no filesystem location: the DCP step folders are resume
    scratch, pruned to the last k and deleted by the train task once the final export is committed, while a
    LoggedModel is permanent, so a path on it would dangle. The weights that outlive the run are the train
    artifact's exports (``hf/``, and ``best/`` when an earlier checkpoint scored better), which the train task
    logs as the run's model.
    """

    def __init__(self, rank: int, spec: Tracked) -> None:
        self.run_id = os.environ.get("MLFLOW_RUN_ID") if rank == 0 else None
        self.spec = spec
        self.lineage: Lineage | None = None
        if self.run_id:
            for k, v in {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                         "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}.items():
                os.environ.setdefault(k, v)
            self.lineage = self._try("look up the run", self._connect)

    def _connect(self) -> Lineage:
        """A Lineage on the run's own experiment (the train task passes only the run id and tracking URI)."""
        from codemill.lineage import Lineage

        assert self.run_id is not None
        return Lineage.of_run(self.run_id)

    def _try(self, what: str, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 (any tracking failure: keep training)
            print(f"warning: MLflow logging failed ({what}), training continues: {e}", file=sys.stderr, flush=True)
            return None

    def log(self, metrics: dict[str, float], step: int) -> None:
        lineage, run_id = self.lineage, self.run_id
        if lineage is not None and run_id is not None:
            self._try(f"metrics at step {step}", lambda: lineage.log_metrics(run_id, metrics, step=step))

    def checkpoint(self, step: int, loss: float, val_loss: float | None) -> None:
        """A committed checkpoint: a LoggedModel of the run with its step, train loss and val loss."""
        if self.lineage is not None:
            self._try(f"checkpoint at step {step}", lambda: self._log_checkpoint(step, loss, val_loss))

    def _log_checkpoint(self, step: int, loss: float, val_loss: float | None) -> None:
        assert self.lineage is not None and self.run_id is not None
        self.lineage.log_step_checkpoint(self.run_id, step, {"train_loss": loss, "val_loss": val_loss},
                                         self.spec.dataset_name, self.spec.dataset_digest)


class Trainer:
    """One run of an objective. Setup in ``__init__`` and ``setup``; ``run`` is the loop: one step, maybe log,
    maybe checkpoint, until the objective has no next step; then ``finish``."""

    def __init__(self, objective: Objective) -> None:
        self.objective, self.settings = objective, objective.settings
        self.core = TrainingCore.start(self.settings.device)
        self.d = self.core.d
        self.pusher = rank_pusher(self.d.rank) if self.d.rank == 0 else None  # when the flow run pushes metrics
        self.step = 0  # steps done: the next step's index, and the data cursor
        self.saving: dict[int, tuple[float, float, float | None]] = {}  # step -> (save started, loss, val loss)

    def run(self) -> dict[str, Any]:
        """Every step the objective hands over, then its export; ends with a barrier (the process group is left
        to ``run_rank``)."""
        plan = self.objective.open(self.d)
        if plan.total_steps == 0:  # nothing to train: no model is built
            return self.done(self.objective.finish(None))
        self.setup(plan)
        while (batches := self.objective.next_step(self.step)) is not None:
            record = self.train_step(batches)
            self.maybe_log(record)
            self.maybe_checkpoint(record)
        return self.finish()

    def setup(self, plan: RunPlan) -> None:
        """Checkpoints opened (refused while another run holds them), the model built and wrapped with its
        optimiser, the last committed checkpoint resumed."""
        s, d, core, objective = self.settings, self.d, self.core, self.objective
        self.total, self.fingerprint = plan.total_steps, plan.fingerprint
        self.ckpt = core.open_checkpoints(s.ckpt_dir, s.keep_checkpoints,
                                          async_save=s.async_checkpoint and d.device.type == "cuda",
                                          on_commit=self.committed)
        core.attach(objective.build_model(d), s.parallelism, s.dtype, plan.optimization, compile=s.compile)
        objective.attached(core)
        self.resume(plan.mismatch)
        self.logger = RankZeroLogger(d.rank, objective.tracked) if objective.tracked is not None else None
        fields = objective.begin(self.step)
        if d.rank == 0:
            emit("start", world=d.world, device=str(d.device), parallelism=s.parallelism, start_step=self.step,
                 **fields)

    def resume(self, mismatch: str) -> None:
        """The last committed checkpoint's state: weights, optimizer, scheduler and RNG restored in place, the
        step and the objective's state. A checkpoint of another run (its fingerprint differs) is refused."""
        saved = self.core.resume()
        if saved is None:
            return
        if self.fingerprint is not None and saved.get("fingerprint") != self.fingerprint:
            raise RuntimeError(f"{self.ckpt.root} holds a checkpoint of a different update ({mismatch}); refusing "
                               "to resume it. Delete the directory to start over.")
        self.objective.restore(saved)
        self.ckpt.protected = self.objective.best_step
        self.step = int(saved["step"])
        if self.d.rank == 0:
            emit("resumed", step=self.step)

    def train_step(self, batches: MicroBatches[Any]) -> dict[str, Any]:
        """One optimizer step: the micro-batches' gradients accumulated (synced on the last), clipped and applied;
        the objective's record of it."""
        core, objective, last = self.core, self.objective, len(batches) - 1
        core.opt.zero_grad(set_to_none=True)
        for micro, batch in enumerate(batches):
            with parallel.set_grad_sync(core.module, self.settings.parallelism, micro == last), core.autocast:
                loss, seen = objective.loss(core.module, batch)
                loss.backward()
            objective.account(seen)
        lr = float(core.sched.get_last_lr()[0])  # the step's own rate, before the schedule moves on
        grad_norm = core.step(self.settings.grad_clip)
        record = objective.end_step(self.step, grad_norm, lr)
        self.step += 1
        return record

    def maybe_log(self, record: dict[str, Any]) -> None:
        """Rank 0, every ``log_every`` steps and at the last: the objective's metrics to MLflow, the gauges and
        one JSON line."""
        if self.d.rank != 0:
            return
        count_step()
        done, total = self.step, self.total
        if not (done % self.settings.log_every == 0 or done == total):
            return
        metrics = self.objective.logged(record)
        if self.logger is not None:
            self.logger.log(metrics, step=done)
        record_step(metrics[self.objective.loss_metric], metrics["grad_norm"], metrics["lr"],
                    metrics.get("tokens_per_s"), metrics.get("mfu"))
        emit("step", step=done, max_steps=total, **metrics)

    def maybe_checkpoint(self, record: dict[str, Any]) -> None:
        """Every ``checkpoint_every`` steps before the last (the last is exported instead): the held-out
        evaluation, then a DCP save, reported when it commits (at once; an async save at the next save or in
        ``finish``)."""
        done, total = self.step, self.total
        if done % self.settings.checkpoint_every or (total is not None and done >= total):
            return
        held_out = self.evaluate()
        self.saving[done] = (time.perf_counter(), record[self.objective.loss_metric], held_out.get("val_loss"))
        state = self.objective.checkpoint_state()
        if self.fingerprint is not None:
            state["fingerprint"] = self.fingerprint
        self.core.save(done, state)

    def evaluate(self) -> dict[str, float]:
        """The objective's held-out metrics now, logged; its best step's checkpoint survives pruning."""
        metrics = self.objective.evaluate(self.step)
        self.ckpt.protected = self.objective.best_step
        if metrics and self.logger is not None:
            self.logger.log(metrics, step=self.step)
        return metrics

    def committed(self, step: int, saved: dict[str, Any]) -> None:
        """Rank 0, once a checkpoint is committed: report it, and log it to MLflow."""
        started, loss, val_loss = self.saving.pop(step)
        record_checkpoint_commit(time.perf_counter() - started)
        emit("checkpoint", step=step, val_loss=val_loss)
        if self.logger is not None:
            self.logger.checkpoint(step, loss, val_loss)

    def finish(self) -> dict[str, Any]:
        """Commit the checkpoint in flight, evaluate the final weights, and let the objective export them."""
        self.ckpt.finish()
        self.evaluate()
        return self.done(self.objective.finish(self.core))

    def done(self, finished: Finished) -> dict[str, Any]:
        """The done line once every output is written; the barrier after which ``run_rank`` may exit."""
        if self.d.rank == 0:
            emit("done", **finished.done)
            if self.pusher is not None:
                self.pusher.finish()
        self.d.barrier()
        return finished.summary


def run(objective: Objective) -> dict[str, Any]:
    """One run of ``objective`` on this rank; its summary."""
    return Trainer(objective).run()


def train(spec: TrainSpec) -> dict[str, Any]:
    """The language-model objective on ``spec``."""
    return run(LanguageModeling(spec))


def language_model(spec_path: Path) -> LanguageModeling:
    return LanguageModeling(TrainSpec.model_validate_json(spec_path.read_text()))


def main(argv: list[str] | None = None, objective: Callable[[Path], Objective] = language_model,
         prog: str = "codemill.models.trainer") -> int:
    """A torchrun rank: ``objective`` built from the spec file in ``argv`` and run; ``prog`` is the module the
    usage line names."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m {prog} SPEC.json", file=sys.stderr)
        return 2
    start_rank()  # die with torchrun and with the launcher; stack dumps on a hang
    return run_rank(lambda: run(objective(Path(argv[0]))))


if __name__ == "__main__":
    raise SystemExit(main())
