"""The training core of the one training loop (``models.trainer``): objectives (``models.objective``) differ in
their batches and their loss, not in how they set up, wrap, optimise, checkpoint or resume.

``TrainingCore.start`` joins the process group on the configured device (deterministic algorithms on CPU, so a
resumed run repeats the same arithmetic) and opens the job's checkpoint directory; ``attach`` wraps the model
(DDP or FSDP2, optionally compiled) and builds AdamW (weight decay on the weight matrices only), the LambdaLR
schedule and the bf16 autocast; ``resume`` restores the last committed checkpoint (weights, optimizer, scheduler,
RNG) and returns what the loop saved beside them; ``step`` clips, steps the optimizer and the schedule.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, cast

import torch

from codemill.models import parallel
from codemill.models.checkpoint import Checkpointer, committed_steps
from codemill.models.common import param_groups
from codemill.models.objective import Optimization
from codemill.models.schedule import lr_multiplier


class TrainingCore:
    d: parallel.Dist
    ckpt: Checkpointer
    model: torch.nn.Module
    module: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    autocast: AbstractContextManager[Any]

    @classmethod
    def start(cls, device: str) -> TrainingCore:
        core = cls()
        core.d = parallel.setup(device)
        if device != "cuda" and core.d.device.type == "cpu":
            torch.use_deterministic_algorithms(True, warn_only=True)
        return core

    def open_checkpoints(self, root: str | Path, keep: int, *, async_save: bool = False,
                         on_commit: Callable[[int, dict[str, Any]], None] | None = None) -> Checkpointer:
        """One job per checkpoint directory; what a killed run left uncommitted is cleared."""
        self.ckpt = Checkpointer(Path(root), self.d.rank, keep, self.d.barrier, async_save=async_save,
                                 on_commit=on_commit)
        self.ckpt.open()
        return self.ckpt

    def attach(self, model: torch.nn.Module, parallelism: str, dtype: str, optim: Optimization, *,
               compile: bool = False) -> None:
        d, bf16 = self.d, dtype == "bfloat16"
        self.model = model
        module = parallel.wrap(model, parallelism, d, bf16=bf16)
        self.module = cast(torch.nn.Module, torch.compile(module)) if compile else module
        self.opt = torch.optim.AdamW(param_groups(model, optim.weight_decay), lr=optim.lr,
                                     betas=(optim.beta1, optim.beta2), fused=d.device.type == "cuda")
        schedule_kwargs: dict[str, Any] = {"warmup": optim.warmup_steps, "total": optim.total_steps,
                                           "min_ratio": optim.min_lr_ratio}
        if optim.decay_fraction is not None:
            schedule_kwargs["decay_fraction"] = optim.decay_fraction
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_multiplier(optim.schedule, s, **schedule_kwargs))
        self.autocast = (torch.autocast(d.device.type, dtype=torch.bfloat16)
                         if bf16 and parallelism == "ddp" else nullcontext())

    def resume(self) -> dict[str, Any] | None:
        """The last committed checkpoint restored in place; what the loop saved with it (None: a fresh start)."""
        steps = committed_steps(self.ckpt.root)
        if not steps:
            return None
        return self.ckpt.load(steps[-1], self.model, self.opt, self.sched)

    def save(self, step: int, extra: dict[str, Any]) -> None:
        self.ckpt.save(step, self.model, self.opt, self.sched, extra)

    def step(self, grad_clip: float) -> float:
        """Clip the global gradient norm, step the optimizer and the schedule; the pre-clip norm."""
        grad_norm = parallel.as_float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), grad_clip))
        self.opt.step()
        self.sched.step()
        return grad_norm
