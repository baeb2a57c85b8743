"""The language-model objective: next-token loss on packed token shards (pretraining, fine-tuning, rejection
sampling), run by the one training loop (``models.trainer``) from a ``TrainSpec``.

Every rank reads the same packed shards through a seeded order (the data cursor is the step, so resume is exact).
The held-out loss at every checkpoint picks the best step, whose checkpoint survives pruning and is exported as
``best/`` beside the final ``hf/`` (Hugging Face format, safetensors, with the tokenizer; LoRA merged).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist
from pydantic import BaseModel

from codemill.models import parallel
from codemill.models.batches import Batches, held_out_rows, model_inputs
from codemill.models.build import build_model, count_parameters, load_pretrained, use_attention, write_export
from codemill.models.common import full_state_dict
from codemill.models.config import TrainConfig
from codemill.models.core import TrainingCore
from codemill.models.flops import flops_per_token, mfu, peak_flops
from codemill.models.objective import Finished, LoopSettings, MicroBatches, Optimization, RunPlan

SUMMARY = "train_summary.json"


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


class LanguageModeling:
    """The mean next-token loss of ``grad_accum_steps`` micro-batches a step; step metrics: loss, the rate after
    the step, grad norm, tokens/s and MFU (on a known GPU)."""

    loss_metric: ClassVar[str] = "train_loss"

    def __init__(self, spec: TrainSpec) -> None:
        self.spec = spec
        self.cfg = cfg = spec.train
        self.tracked = spec
        self.settings = LoopSettings(cfg.device, cfg.parallelism, cfg.dtype, cfg.grad_clip, spec.ckpt_dir,
                                     cfg.keep_checkpoints, cfg.checkpoint_every, cfg.log_every, cfg.compile,
                                     cfg.async_checkpoint)
        self.state = TrainState()
        self.start_step = 0

    def open(self, d: parallel.Dist) -> RunPlan:
        """The token shards are read once the model's attention kernel is known (``build_model``)."""
        self.d = d
        cfg = self.cfg
        return RunPlan(cfg.max_steps, Optimization(cfg.lr, cfg.beta1, cfg.beta2, cfg.weight_decay, cfg.schedule,
                                                   cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio,
                                                   cfg.decay_fraction))

    def build_model(self, d: parallel.Dist) -> torch.nn.Module:
        spec, cfg = self.spec, self.cfg
        self.model = make_model(spec).to(d.device)
        self.attention = use_attention(self.model, d.device, cfg.document_masking)  # flex_attention | sdpa
        self.batches = Batches(Path(spec.tokens_dir), cfg, d, self.attention)
        self.n_params = count_parameters(self.model)
        mcfg = self.model.config
        self.flops_per_token = flops_per_token(self.n_params, mcfg.num_hidden_layers, mcfg.num_attention_heads,
                                               mcfg.hidden_size // mcfg.num_attention_heads, spec.seq_len)
        self.peak = peak_flops(torch.cuda.get_device_name(d.device)) if d.device.type == "cuda" else None
        self.val_rows = held_out_rows(Path(spec.tokens_dir).parent / "val", cfg.val_sequences, d)
        self.tokens_per_step = d.world * cfg.micro_batch_size * cfg.grad_accum_steps * spec.seq_len
        return self.model

    def attached(self, core: TrainingCore) -> None:
        self.core = core

    def restore(self, saved: dict[str, Any]) -> None:
        self.state = TrainState.restore(saved)

    def begin(self, start_step: int) -> dict[str, Any]:
        self.start_step = start_step
        self.core.module.train()
        self.throughput, self.started = Throughput(self.tokens_per_step), time.perf_counter()
        return {"params": self.n_params, "sequences": self.batches.sequences, "max_steps": self.cfg.max_steps,
                "attention": self.attention}

    def next_step(self, step: int) -> MicroBatches[Any] | None:
        if step >= self.cfg.max_steps:
            return None
        self.loss_sum = torch.zeros((), device=self.d.device)
        return MicroBatches(self.cfg.grad_accum_steps, lambda micro: self.batches.micro_batch(step, micro))

    def loss(self, module: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, Any]:
        loss = module(**batch).loss / self.cfg.grad_accum_steps
        return loss, loss

    def account(self, seen: Any) -> None:
        self.loss_sum += seen.detach()

    def end_step(self, step: int, grad_norm: float, lr: float) -> dict[str, Any]:
        """The step's loss averaged over ranks."""
        loss = self.loss_sum
        if self.d.distributed:
            dist.all_reduce(loss, op=dist.ReduceOp.SUM)
            loss /= self.d.world
        self.state.losses.append(float(loss))
        self.state.step = step + 1
        self.throughput.step()
        return {"train_loss": self.state.losses[-1], "grad_norm": grad_norm}

    def logged(self, record: dict[str, Any]) -> dict[str, float]:
        """``lr`` is the schedule's rate after the step (the next step's)."""
        tps = self.throughput.read()
        metrics = {"train_loss": record["train_loss"], "lr": float(self.core.sched.get_last_lr()[0]),
                   "grad_norm": record["grad_norm"], "tokens_per_s": tps,
                   "tokens_seen": self.state.step * self.tokens_per_step}
        util = mfu(tps, self.flops_per_token, self.d.world, self.peak)
        if util is not None:
            metrics["mfu"] = util
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        """The held-out loss (when there are held-out rows)."""
        if self.val_rows is None:
            return {}
        self.state.val_losses[step] = validation_loss(self.core.module, self.val_rows, self.cfg, self.d,
                                                      self.attention)
        return {"val_loss": self.state.val_losses[step]}

    @property
    def best_step(self) -> int | None:
        return self.state.best_step

    def checkpoint_state(self) -> dict[str, Any]:
        return self.state.snapshot()

    def finish(self, core: TrainingCore | None) -> Finished:
        """Export the final weights (and the best checkpoint's when an earlier one scored better) and write
        ``train_summary.json``."""
        if core is None:
            raise ValueError("a language-model run has at least one step")
        cfg, d, state = self.cfg, self.d, self.state
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
            core.ckpt.load_model_only(best, self.model)
            export(self.model, self.spec, d, "best")
        if d.rank == 0:
            (Path(self.spec.out_dir) / SUMMARY).write_text(json.dumps(summary, indent=2))
        return Finished(summary, {"final_loss": summary["final_loss"]})


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
