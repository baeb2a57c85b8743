"""The torchrun training entrypoint: ``python -m torch.distributed.run ... -m codemill.models.trainer SPEC``.

SPEC is a JSON file written by the train task (``TrainSpec``). Every rank reads the same packed token shards
through a seeded order (the data cursor is the step, so resume is exact). DDP or FSDP2 over gloo (CPU) or
nccl (CUDA). Rank 0 logs to MLflow (when MLFLOW_RUN_ID is set) and prints one JSON line per logged step.
Checkpoints are DCP, committed atomically; the final model and tokenizer are exported in Hugging Face
format (safetensors).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from pydantic import BaseModel
from transformers import PreTrainedModel

from codemill.metrics.push import rank_pusher
from codemill.metrics.training import count_step, record_checkpoint_commit, record_step
from codemill.models import parallel
from codemill.models.batches import Batches, held_out_rows, model_inputs
from codemill.models.build import build_model, count_parameters, load_pretrained, use_attention
from codemill.models.common import STACK_DUMP_ENV, emit, full_state_dict, param_groups, run_rank, start_rank
from codemill.models.config import TrainConfig
from codemill.models.core import Optimization, TrainingCore
from codemill.models.flops import flops_per_token, mfu, peak_flops

if TYPE_CHECKING:
    from codemill.lineage import Lineage

__all__ = ["STACK_DUMP_ENV", "TrainSpec", "emit", "full_state_dict", "param_groups", "train", "write_export"]


class TrainSpec(BaseModel):
    train: TrainConfig
    tokens_dir: str
    tokenizer_dir: str
    out_dir: str
    ckpt_dir: str
    vocab_size: int
    eos_id: int
    pad_id: int
    seq_len: int
    dataset_name: str = "tokens"
    dataset_digest: str | None = None


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

    def __init__(self, rank: int, spec: TrainSpec) -> None:
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


def make_model(spec: TrainSpec) -> Any:
    """A transformers causal LM, or its peft wrapper (which forwards the model's attributes)."""
    cfg = spec.train
    model: Any
    if cfg.init_from:
        model = load_pretrained(cfg.init_from, seed=cfg.seed)
        if model.get_input_embeddings().num_embeddings < spec.vocab_size:  # pad / FIM tokens were added
            model.resize_token_embeddings(spec.vocab_size)
    else:
        model = build_model(cfg.model, spec.vocab_size, spec.seq_len, spec.eos_id, spec.pad_id, cfg.seed)
    if cfg.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha,
                                                 lora_dropout=cfg.lora.dropout,
                                                 target_modules=cfg.lora.target_modules, task_type="CAUSAL_LM"))
    return model


@dataclass
class TrainState:
    """What a checkpoint restores besides weights, optimizer, scheduler and RNG: the step (which is also the
    data cursor), the loss history and the validation losses (which pick the best checkpoint)."""

    step: int = 0
    losses: list[float] = field(default_factory=list)
    val_losses: dict[int, float] = field(default_factory=dict)

    @classmethod
    def restore(cls, saved: dict[str, Any]) -> TrainState:
        val = {int(k): v for k, v in saved.get("val_losses", {}).items()}
        return cls(saved["step"], list(saved["losses"]), val)

    def snapshot(self) -> dict[str, Any]:
        """Copies: an async checkpoint commits later, and must hold the state of its own step."""
        return {"losses": list(self.losses), "val_losses": dict(self.val_losses)}

    @property
    def best_step(self) -> int | None:
        return min(self.val_losses, key=self.val_losses.__getitem__) if self.val_losses else None


class Throughput:
    """Tokens per second over the steps since the last reading."""

    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step, self.steps, self.since = tokens_per_step, 0, time.perf_counter()

    def step(self) -> None:
        self.steps += 1

    def read(self) -> float:
        now = time.perf_counter()
        tps = self.tokens_per_step * self.steps / (now - self.since)
        self.steps, self.since = 0, now
        return tps


class Trainer:
    """Setup in ``__init__``; ``train`` is the loop: one step, maybe log, maybe checkpoint; then ``finalize``."""

    def __init__(self, spec: TrainSpec) -> None:
        self.spec = spec
        self.cfg = cfg = spec.train
        self.core = core = TrainingCore.start(cfg.device)
        self.d = d = core.d
        self.ckpt = core.open_checkpoints(spec.ckpt_dir, cfg.keep_checkpoints,
                                          async_save=cfg.async_checkpoint and d.device.type == "cuda",
                                          on_commit=self._committed)
        self.model = make_model(spec).to(d.device)
        self.attention = use_attention(self.model, d.device, cfg.document_masking)  # flex_attention | sdpa
        self.batches = Batches(Path(spec.tokens_dir), cfg, d, self.attention)
        self.n_params = count_parameters(self.model)
        mcfg = self.model.config
        self.flops_per_token = flops_per_token(self.n_params, mcfg.num_hidden_layers, mcfg.num_attention_heads,
                                               mcfg.hidden_size // mcfg.num_attention_heads, spec.seq_len)
        self.peak = peak_flops(torch.cuda.get_device_name(d.device)) if d.device.type == "cuda" else None
        core.attach(self.model, cfg.parallelism, cfg.dtype, Optimization(
            cfg.lr, cfg.beta1, cfg.beta2, cfg.weight_decay, cfg.schedule, cfg.warmup_steps, cfg.max_steps,
            cfg.min_lr_ratio, cfg.decay_fraction), compile=cfg.compile)
        self.module, self.opt, self.sched, self.autocast = core.module, core.opt, core.sched, core.autocast

        self.val_rows = held_out_rows(Path(spec.tokens_dir).parent / "val", cfg.val_sequences, d)
        self.state = self.resume()
        self.start_step = self.state.step
        self.logger = RankZeroLogger(d.rank, spec)
        self.tokens_per_step = d.world * cfg.micro_batch_size * cfg.grad_accum_steps * spec.seq_len
        if d.rank == 0:
            emit("start", params=self.n_params, world=d.world, device=str(d.device),
                 sequences=self.batches.sequences, start_step=self.start_step, max_steps=cfg.max_steps,
                 parallelism=cfg.parallelism, attention=self.attention)
        self.throughput, self.started = Throughput(self.tokens_per_step), time.perf_counter()
        self.pusher = rank_pusher(d.rank) if d.rank == 0 else None  # when the flow run pushes metrics
        self.saving: dict[int, float] = {}  # step -> when its checkpoint save started

    def resume(self) -> TrainState:
        """The last committed checkpoint's state (weights, optimizer, scheduler and RNG restored in place)."""
        saved = self.core.resume()
        if saved is None:
            return TrainState()
        state = TrainState.restore(saved)
        self.ckpt.protected = state.best_step
        if self.d.rank == 0:
            emit("resumed", step=state.step)
        return state

    def train(self) -> dict[str, Any]:
        self.module.train()
        for step in range(self.start_step, self.cfg.max_steps):
            grad_norm = self.train_step(step)
            self.maybe_log(grad_norm)
            self.maybe_checkpoint()
        return self.finalize()

    def forward_backward(self, step: int) -> torch.Tensor:
        """Gradients of one step, accumulated over its micro-batches (synced on the last); the summed loss."""
        cfg = self.cfg
        loss_sum = torch.zeros((), device=self.d.device)
        for micro in range(cfg.grad_accum_steps):
            inputs = self.batches.micro_batch(step, micro)
            last = micro == cfg.grad_accum_steps - 1
            with parallel.set_grad_sync(self.module, cfg.parallelism, last), self.autocast:
                loss = self.module(**inputs).loss / cfg.grad_accum_steps
                loss.backward()
            loss_sum += loss.detach()
        return loss_sum

    def train_step(self, step: int) -> float:
        """One optimizer step; records the loss averaged over ranks and returns the (pre-clip) grad norm."""
        self.opt.zero_grad(set_to_none=True)
        loss = self.forward_backward(step)
        grad_norm = self.core.step(self.cfg.grad_clip)
        if self.d.distributed:
            dist.all_reduce(loss, op=dist.ReduceOp.SUM)
            loss /= self.d.world
        self.state.losses.append(float(loss))
        self.state.step = step + 1
        return grad_norm

    def maybe_log(self, grad_norm: float) -> None:
        """Rank 0, every ``log_every`` steps and at the last: MLflow metrics and one JSON line."""
        done, cfg = self.state.step, self.cfg
        self.throughput.step()
        if self.d.rank != 0:
            return
        count_step()
        if not (done % cfg.log_every == 0 or done == cfg.max_steps):
            return
        tps = self.throughput.read()
        metrics = {"train_loss": self.state.losses[-1], "lr": float(self.sched.get_last_lr()[0]),
                   "grad_norm": grad_norm, "tokens_per_s": tps, "tokens_seen": done * self.tokens_per_step}
        util = mfu(tps, self.flops_per_token, self.d.world, self.peak)
        if util is not None:
            metrics["mfu"] = util
        self.logger.log(metrics, step=done)
        record_step(metrics["train_loss"], grad_norm, metrics["lr"], tps, util)
        emit("step", step=done, max_steps=cfg.max_steps, **metrics)

    def maybe_checkpoint(self) -> None:
        """Every ``checkpoint_every`` steps before the last (the last is exported instead): the val loss, then a
        DCP save, logged when it commits (at once; an async save at the next save or in ``finalize``)."""
        done = self.state.step
        if done % self.cfg.checkpoint_every or done >= self.cfg.max_steps:
            return
        self.validate()
        self.saving[done] = time.perf_counter()
        self.core.save(done, self.state.snapshot())

    def validate(self) -> None:
        """The held-out loss at this step (when there are held-out rows); the best step survives pruning."""
        if self.val_rows is None:
            return
        done = self.state.step
        self.state.val_losses[done] = validation_loss(self.module, self.val_rows, self.cfg, self.d, self.attention)
        self.ckpt.protected = self.state.best_step
        self.logger.log({"val_loss": self.state.val_losses[done]}, step=done)

    def _committed(self, step: int, saved: dict[str, Any]) -> None:
        """Rank 0, once a checkpoint is committed: report it, and log it to MLflow."""
        val_loss = saved["val_losses"].get(step)
        if step in self.saving:
            record_checkpoint_commit(time.perf_counter() - self.saving.pop(step))
        emit("checkpoint", step=step, val_loss=val_loss)
        self.logger.checkpoint(step, saved["losses"][-1], val_loss)

    def finalize(self) -> dict[str, Any]:
        """Commit the checkpoint in flight, score the final weights, export them (and the best checkpoint when
        an earlier one scored better), and write ``train_summary.json`` once."""
        cfg, d, state = self.cfg, self.d, self.state
        self.ckpt.finish()
        self.validate()
        last = state.losses[-max(1, min(10, len(state.losses))):]
        summary = {"params": self.n_params, "world_size": d.world, "steps": cfg.max_steps,
                   "tokens_per_step": self.tokens_per_step, "tokens_seen": cfg.max_steps * self.tokens_per_step,
                   "losses": state.losses, "final_loss": float(np.mean(last)),
                   "resumed_from": self.start_step, "wall_s": time.perf_counter() - self.started,
                   "parallelism": cfg.parallelism, "attention": self.attention, "val_losses": state.val_losses,
                   "best_step": state.best_step}
        export(self.model, self.spec, d, "hf")
        best = state.best_step
        if best is not None and best != cfg.max_steps:
            self.ckpt.load_model_only(best, self.model)
            export(self.model, self.spec, d, "best")
        if d.rank == 0:
            (Path(self.spec.out_dir) / "train_summary.json").write_text(json.dumps(summary, indent=2))
            emit("done", final_loss=summary["final_loss"])
            if self.pusher is not None:
                self.pusher.finish()
        d.barrier()  # every rank's exports are written; the process group is left to run_rank's os._exit
        return summary


def train(spec: TrainSpec) -> dict[str, Any]:
    return Trainer(spec).train()


@torch.no_grad()
def validation_loss(module: torch.nn.Module, rows: tuple[np.ndarray, np.ndarray | None], cfg: TrainConfig,
                    d: parallel.Dist, attention: str = "sdpa") -> float:
    """Mean token loss on the held-out rows, averaged over ranks (every rank runs the same batch count)."""
    tokens, positions = rows
    module.eval()
    total = torch.zeros(2, dtype=torch.float64, device=d.device)
    for start in range(0, len(tokens), cfg.micro_batch_size):
        batch = torch.from_numpy(tokens[start:start + cfg.micro_batch_size]).to(d.device)
        pos = (torch.from_numpy(positions[start:start + cfg.micro_batch_size]).to(d.device)
               if positions is not None and cfg.document_masking else None)
        loss = module(**model_inputs(batch, pos, attention)).loss
        total += torch.tensor([float(loss) * len(batch), len(batch)], dtype=torch.float64, device=d.device)
    module.train()
    if d.distributed:
        dist.all_reduce(total)
    return float(total[0] / total[1])


def export(model: torch.nn.Module, spec: TrainSpec, d: parallel.Dist, name: str = "hf") -> None:
    """Model + tokenizer in Hugging Face format (safetensors) under ``out_dir/name``, loadable by from_pretrained.

    LoRA adapters are merged into the base weights, so the export is a plain model."""
    state = full_state_dict(model)
    if d.rank != 0:
        return
    fresh = make_model(spec)
    fresh.load_state_dict(state)
    if spec.train.lora:
        fresh = fresh.merge_and_unload()
    write_export(fresh, Path(spec.tokenizer_dir), Path(spec.out_dir), name)


def write_export(model: PreTrainedModel, tokenizer_dir: Path, out_dir: Path, name: str = "hf") -> None:
    hf_dir = out_dir / name
    model.config.use_cache = True
    model.save_pretrained(str(hf_dir), safe_serialization=True)
    for f in (tokenizer_dir / "hf").iterdir():
        shutil.copy2(f, hf_dir / f.name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m codemill.models.trainer SPEC.json", file=sys.stderr)
        return 2
    start_rank()  # die with torchrun and with the launcher; stack dumps on a hang
    spec = TrainSpec.model_validate_json(Path(argv[0]).read_text())
    return run_rank(lambda: train(spec))


if __name__ == "__main__":
    raise SystemExit(main())
