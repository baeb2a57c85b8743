"""The torchrun training entrypoint: ``python -m torch.distributed.run ... -m codemill.models.trainer SPEC``.

SPEC is a JSON file written by the train task (see ``TrainSpec``). Every rank reads the same packed token
shards through a seeded order; DDP runs when WORLD_SIZE > 1 (gloo on CPU, nccl on CUDA). Rank 0 logs to
MLflow (when MLFLOW_RUN_ID is set), prints one JSON line per logged step on stdout, checkpoints
periodically, and finally exports the model and tokenizer in Hugging Face format (safetensors).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from pydantic import BaseModel

from codemill.config import TrainConfig
from codemill.data.pack import open_token_shards
from codemill.models import checkpoint as ckpt
from codemill.models.build import build_model, count_parameters
from codemill.models.data_order import SequenceOrder, gather_rows
from codemill.models.schedule import cosine_with_warmup


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


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class RankZeroLogger:
    """MLflow metrics from rank 0 only; a no-op elsewhere or when no run was handed over."""

    def __init__(self, rank: int) -> None:
        self.run_id = os.environ.get("MLFLOW_RUN_ID") if rank == 0 else None
        self.client = None
        if self.run_id:
            from mlflow import MlflowClient

            self.client = MlflowClient()

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


def pick_device(cfg: TrainConfig, local_rank: int) -> torch.device:
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only; norms and biases are not decayed."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train(spec: TrainSpec) -> dict:
    cfg = spec.train
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = pick_device(cfg, local_rank)
    distributed = world > 1
    if distributed:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")

    ckpt_root = Path(spec.ckpt_dir)
    if rank == 0:
        ckpt.clear_staging(ckpt_root)
    shards = open_token_shards(Path(spec.tokens_dir))
    rows = np.array([s.shape[0] for s in shards], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(rows)])
    order = SequenceOrder(int(rows.sum()), cfg.seed)

    model = build_model(cfg.model, spec.vocab_size, spec.seq_len, spec.eos_id, spec.pad_id, cfg.seed).to(device)
    n_params = count_parameters(model)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                            fused=device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_with_warmup(
        s, warmup=cfg.warmup_steps, total=cfg.max_steps, min_ratio=cfg.min_lr_ratio))

    start_step, losses = 0, []
    resumable = ckpt.committed_steps(ckpt_root)
    if resumable:
        state, rng = ckpt.load(ckpt_root, resumable[-1], rank)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start_step, losses = state["step"], state["losses"]
        ckpt.set_rng_state(rng)
        if rank == 0:
            emit("resumed", step=start_step)

    ddp = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if cfg.dtype == "bfloat16"
                else nullcontext())
    logger = RankZeroLogger(rank)
    if rank == 0:
        emit("start", params=n_params, world=world, device=str(device), sequences=int(rows.sum()),
             start_step=start_step, max_steps=cfg.max_steps)
    tokens_per_step = world * cfg.micro_batch_size * cfg.grad_accum_steps * spec.seq_len
    t_last, steps_since = time.perf_counter(), 0
    train_start = time.perf_counter()
    ddp.train()
    for step in range(start_step, cfg.max_steps):
        opt.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=device)
        for micro in range(cfg.grad_accum_steps):
            ids = order.indices(step, micro, rank, world=world, micro_batch=cfg.micro_batch_size,
                                accum=cfg.grad_accum_steps)
            batch = torch.from_numpy(gather_rows(shards, offsets, ids)).to(device)
            sync = nullcontext() if (not distributed or micro == cfg.grad_accum_steps - 1) else ddp.no_sync()
            with sync, autocast:
                loss = ddp(input_ids=batch, labels=batch).loss / cfg.grad_accum_steps
                loss.backward()
            loss_sum += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        if distributed:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
        losses.append(float(loss_sum))
        steps_since += 1
        done = step + 1
        if rank == 0 and (done % cfg.log_every == 0 or done == cfg.max_steps):
            now = time.perf_counter()
            tps = tokens_per_step * steps_since / (now - t_last)
            t_last, steps_since = now, 0
            metrics = {"train_loss": losses[-1], "lr": sched.get_last_lr()[0], "grad_norm": float(grad_norm),
                       "tokens_per_s": tps, "tokens_seen": done * tokens_per_step}
            logger.log(metrics, step=done)
            emit("step", step=done, max_steps=cfg.max_steps, **metrics)
        if done % cfg.checkpoint_every == 0 and done < cfg.max_steps:
            save_checkpoint(ckpt_root, done, rank, distributed, model, opt, sched, losses, cfg.keep_checkpoints)

    summary = {"params": n_params, "world_size": world, "steps": cfg.max_steps, "tokens_per_step": tokens_per_step,
               "tokens_seen": cfg.max_steps * tokens_per_step, "losses": losses,
               "final_loss": float(np.mean(losses[-max(1, min(10, len(losses))):])),
               "resumed_from": start_step, "wall_s": time.perf_counter() - train_start}
    if rank == 0:
        export(model, Path(spec.tokenizer_dir), Path(spec.out_dir), summary)
        emit("done", final_loss=summary["final_loss"])
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return summary


def save_checkpoint(ckpt_root: Path, step: int, rank: int, distributed: bool, model, opt, sched,
                    losses: list[float], keep: int) -> None:
    if rank == 0:
        ckpt.staging_dir(ckpt_root, step).mkdir(parents=True, exist_ok=True)
    if distributed:
        dist.barrier()
    ckpt.write_rank_part(ckpt_root, step, rank)
    if distributed:
        dist.barrier()
    if rank == 0:
        ckpt.commit(ckpt_root, step, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                      "scheduler": sched.state_dict(), "step": step, "losses": list(losses)},
                    keep)
        emit("checkpoint", step=step)
    if distributed:
        dist.barrier()


def export(model: torch.nn.Module, tokenizer_dir: Path, out_dir: Path, summary: dict) -> None:
    """Final model + tokenizer in Hugging Face format (safetensors), loadable by from_pretrained."""
    hf_dir = out_dir / "hf"
    model.config.use_cache = True
    model.save_pretrained(str(hf_dir), safe_serialization=True)
    for f in (tokenizer_dir / "hf").iterdir():
        shutil.copy2(f, hf_dir / f.name)
    (out_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m codemill.models.trainer SPEC.json", file=sys.stderr)
        return 2
    spec = TrainSpec.model_validate_json(Path(argv[0]).read_text())
    train(spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
