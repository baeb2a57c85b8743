"""The torchrun training entrypoint: ``python -m torch.distributed.run ... -m codemill.models.trainer SPEC``.

SPEC is a JSON file written by the train task (``TrainSpec``). Every rank reads the same packed token shards
through a seeded order (the data cursor is the step, so resume is exact). DDP or FSDP2 over gloo (CPU) or
nccl (CUDA). Rank 0 logs to MLflow (when MLFLOW_RUN_ID is set) and prints one JSON line per logged step.
Checkpoints are DCP, committed atomically; the final model and tokenizer are exported in Hugging Face
format (safetensors).
"""

from __future__ import annotations

import faulthandler
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
from codemill.models import parallel
from codemill.models.build import build_model, count_parameters, load_pretrained
from codemill.models.checkpoint import Checkpointer, clear_staging, committed_steps
from codemill.models.data_order import SequenceOrder, gather_rows
from codemill.models.flops import flops_per_token, mfu, peak_flops
from codemill.models.masking import document_mask
from codemill.models.schedule import lr_multiplier

STACK_DUMP_ENV = "CODEMILL_STACK_DUMP_AFTER_S"


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


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class RankZeroLogger:
    """MLflow from rank 0 only: step metrics, and each committed checkpoint as a LoggedModel.

    Logging is best effort: a tracking server that is briefly down costs a warning, never the training run
    (few, short HTTP retries; the train task registers the final model once the server is back).
    """

    def __init__(self, rank: int, spec: TrainSpec) -> None:
        self.run_id = os.environ.get("MLFLOW_RUN_ID") if rank == 0 else None
        self.spec = spec
        self.client = None
        if self.run_id:
            from mlflow import MlflowClient

            for k, v in {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                         "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}.items():
                os.environ.setdefault(k, v)
            self.client = MlflowClient()
            self.experiment_id = self._try("look up the run", lambda: self.client.get_run(self.run_id)
                                           .info.experiment_id)
            if self.experiment_id is None:
                self.client = None

    def _try(self, what: str, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 (any tracking failure: keep training)
            print(f"warning: MLflow logging failed ({what}), training continues: {e}", file=sys.stderr, flush=True)
            return None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._try(f"metrics at step {step}", lambda: self.client.log_batch(
            self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()]))

    def checkpoint(self, step: int, path: Path, loss: float) -> None:
        if self.client is not None:
            self._try(f"checkpoint at step {step}", lambda: self._log_checkpoint(step, path, loss))

    def _log_checkpoint(self, step: int, path: Path, loss: float) -> None:
        from mlflow.entities import LoggedModelOutput

        m = self.client.create_logged_model(self.experiment_id, name=f"ckpt-step{step}", source_run_id=self.run_id,
                                            tags={"codemill.checkpoint_path": str(path), "codemill.step": str(step)},
                                            model_type="dcp-checkpoint")
        self.client.finalize_logged_model(m.model_id, "READY")
        self.client.log_outputs(self.run_id, [LoggedModelOutput(m.model_id, step)])
        digest = (self.spec.dataset_digest or "")[:32] or None
        self.client.log_metric(self.run_id, "train_loss", loss, step=step, model_id=m.model_id,
                               dataset_name=self.spec.dataset_name if digest else None, dataset_digest=digest)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only; norms and biases are not decayed."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_model(spec: TrainSpec) -> torch.nn.Module:
    cfg = spec.train
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


def train(spec: TrainSpec) -> dict:
    cfg = spec.train
    d = parallel.setup(cfg.device)
    if cfg.device != "cuda" and d.device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
    ckpt_root = Path(spec.ckpt_dir)
    if d.rank == 0:
        clear_staging(ckpt_root)
    d.barrier()
    shards = open_token_shards(Path(spec.tokens_dir))
    positions = open_token_shards(Path(spec.tokens_dir), kind="positions") if cfg.document_masking else []
    rows = np.array([s.shape[0] for s in shards], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(rows)])
    order = SequenceOrder(int(rows.sum()), cfg.seed)

    model = make_model(spec).to(d.device)
    n_params = count_parameters(model)
    mcfg = model.config
    per_token_flops = flops_per_token(n_params, mcfg.num_hidden_layers, mcfg.num_attention_heads,
                                      mcfg.hidden_size // mcfg.num_attention_heads, spec.seq_len)
    peak = peak_flops(torch.cuda.get_device_name(d.device)) if d.device.type == "cuda" else None
    module = parallel.wrap(model, cfg.parallelism, d, bf16=cfg.dtype == "bfloat16")
    if cfg.compile:
        module = torch.compile(module)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                            fused=d.device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(
        cfg.schedule, s, warmup=cfg.warmup_steps, total=cfg.max_steps, min_ratio=cfg.min_lr_ratio,
        decay_fraction=cfg.decay_fraction))
    ckpt = Checkpointer(ckpt_root, d.rank, cfg.keep_checkpoints, d.barrier,
                        async_save=cfg.async_checkpoint and d.device.type == "cuda")

    val_rows = held_out_rows(Path(spec.tokens_dir).parent / "val", cfg.val_sequences, d)
    start_step, losses, val_losses = 0, [], {}
    resumable = committed_steps(ckpt_root)
    if resumable:
        state = ckpt.load(resumable[-1], model, opt, sched)
        start_step, losses = state["step"], list(state["losses"])
        val_losses = {int(k): v for k, v in state.get("val_losses", {}).items()}
        ckpt.protected = min(val_losses, key=val_losses.get) if val_losses else None
        if d.rank == 0:
            emit("resumed", step=start_step)

    autocast = (torch.autocast(d.device.type, dtype=torch.bfloat16)
                if cfg.dtype == "bfloat16" and cfg.parallelism == "ddp" else nullcontext())
    logger = RankZeroLogger(d.rank, spec)
    if d.rank == 0:
        emit("start", params=n_params, world=d.world, device=str(d.device), sequences=int(rows.sum()),
             start_step=start_step, max_steps=cfg.max_steps, parallelism=cfg.parallelism)
    tokens_per_step = d.world * cfg.micro_batch_size * cfg.grad_accum_steps * spec.seq_len
    t_last, steps_since = time.perf_counter(), 0
    train_start = time.perf_counter()
    module.train()
    for step in range(start_step, cfg.max_steps):
        opt.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=d.device)
        for micro in range(cfg.grad_accum_steps):
            ids = order.indices(step, micro, d.rank, world=d.world, micro_batch=cfg.micro_batch_size,
                                accum=cfg.grad_accum_steps)
            batch = torch.from_numpy(gather_rows(shards, offsets, ids)).to(d.device)
            kwargs = {}
            if positions:
                pos = torch.from_numpy(gather_rows(positions, offsets, ids)).to(d.device)
                kwargs = {"position_ids": pos, "attention_mask": document_mask(pos)}
            last = micro == cfg.grad_accum_steps - 1
            with parallel.set_grad_sync(module, cfg.parallelism, last), autocast:
                loss = module(input_ids=batch, labels=batch, **kwargs).loss / cfg.grad_accum_steps
                loss.backward()
            loss_sum += loss.detach()
        grad_norm = parallel.as_float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
        opt.step()
        sched.step()
        if d.distributed:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
            loss_sum /= d.world
        losses.append(float(loss_sum))
        steps_since += 1
        done = step + 1
        if d.rank == 0 and (done % cfg.log_every == 0 or done == cfg.max_steps):
            now = time.perf_counter()
            tps = tokens_per_step * steps_since / (now - t_last)
            t_last, steps_since = now, 0
            metrics = {"train_loss": losses[-1], "lr": sched.get_last_lr()[0], "grad_norm": grad_norm,
                       "tokens_per_s": tps, "tokens_seen": done * tokens_per_step}
            util = mfu(tps, per_token_flops, d.world, peak)
            if util is not None:
                metrics["mfu"] = util
            logger.log(metrics, step=done)
            emit("step", step=done, max_steps=cfg.max_steps, **metrics)
        if done % cfg.checkpoint_every == 0 and done < cfg.max_steps:
            if val_rows is not None:
                val_losses[done] = validation_loss(module, val_rows, cfg, d)
                ckpt.protected = min(val_losses, key=val_losses.get)
                logger.log({"val_loss": val_losses[done]}, step=done)
            ckpt.save(done, model, opt, sched, {"losses": list(losses), "val_losses": val_losses})
            if d.rank == 0:
                emit("checkpoint", step=done, val_loss=val_losses.get(done))
                logger.checkpoint(done, ckpt_root, losses[-1])
    ckpt.finish()
    if val_rows is not None:
        val_losses[cfg.max_steps] = validation_loss(module, val_rows, cfg, d)
        logger.log({"val_loss": val_losses[cfg.max_steps]}, step=cfg.max_steps)

    summary = {"params": n_params, "world_size": d.world, "steps": cfg.max_steps, "tokens_per_step": tokens_per_step,
               "tokens_seen": cfg.max_steps * tokens_per_step, "losses": losses,
               "final_loss": float(np.mean(losses[-max(1, min(10, len(losses))):])),
               "resumed_from": start_step, "wall_s": time.perf_counter() - train_start,
               "parallelism": cfg.parallelism, "val_losses": val_losses}
    export(model, spec, summary, d, "hf")
    best = min(val_losses, key=val_losses.get) if val_losses else None
    summary["best_step"] = best
    if best is not None and best != cfg.max_steps:  # the best checkpoint is an earlier one: export it too
        ckpt.load_model_only(best, model)
        export(model, spec, summary, d, "best")
    if d.rank == 0:
        (Path(spec.out_dir) / "train_summary.json").write_text(json.dumps(summary, indent=2))
    if d.rank == 0:
        emit("done", final_loss=summary["final_loss"])
    if d.distributed:
        dist.barrier()
        dist.destroy_process_group()
    return summary


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded, on CPU (a collective under FSDP: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def held_out_rows(val_dir: Path, n: int, d: parallel.Dist) -> tuple[np.ndarray, np.ndarray | None] | None:
    """This rank's equal share of the first n held-out rows (tokens, positions), or None when off/absent."""
    shards = open_token_shards(val_dir) if n and val_dir.is_dir() else []
    if not shards:
        return None
    tokens = np.concatenate([np.asarray(s) for s in shards])[:n]
    pos_shards = open_token_shards(val_dir, kind="positions")
    positions = np.concatenate([np.asarray(s) for s in pos_shards])[:n] if pos_shards else None
    per_rank = len(tokens) // d.world
    if per_rank == 0:
        return None
    sl = slice(d.rank * per_rank, (d.rank + 1) * per_rank)
    return tokens[sl].astype(np.int64), None if positions is None else positions[sl].astype(np.int64)


@torch.no_grad()
def validation_loss(module: torch.nn.Module, rows: tuple[np.ndarray, np.ndarray | None], cfg: TrainConfig,
                    d: parallel.Dist) -> float:
    """Mean token loss on the held-out rows, averaged over ranks (every rank runs the same batch count)."""
    tokens, positions = rows
    module.eval()
    total = torch.zeros(2, dtype=torch.float64, device=d.device)
    for start in range(0, len(tokens), cfg.micro_batch_size):
        batch = torch.from_numpy(tokens[start:start + cfg.micro_batch_size]).to(d.device)
        kwargs = {}
        if positions is not None and cfg.document_masking:
            pos = torch.from_numpy(positions[start:start + cfg.micro_batch_size]).to(d.device)
            kwargs = {"position_ids": pos, "attention_mask": document_mask(pos)}
        loss = module(input_ids=batch, labels=batch, **kwargs).loss
        total += torch.tensor([float(loss) * len(batch), len(batch)], dtype=torch.float64, device=d.device)
    module.train()
    if d.distributed:
        dist.all_reduce(total)
    return float(total[0] / total[1])


def export(model: torch.nn.Module, spec: TrainSpec, summary: dict, d: parallel.Dist, name: str = "hf") -> None:
    """Final model + tokenizer in Hugging Face format (safetensors), loadable by from_pretrained.

    LoRA adapters are merged into the base weights, so the export is a plain model."""
    state = full_state_dict(model)
    if d.rank != 0:
        return
    fresh = make_model(spec)
    fresh.load_state_dict(state)
    if spec.train.lora:
        fresh = fresh.merge_and_unload()
    write_export(fresh, Path(spec.tokenizer_dir), Path(spec.out_dir), summary, name)


def write_export(model: torch.nn.Module, tokenizer_dir: Path, out_dir: Path, summary: dict, name: str = "hf") -> None:
    hf_dir = out_dir / name
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
    faulthandler.enable()
    dump_after = os.environ.get(STACK_DUMP_ENV)
    if dump_after:  # a hang (a stuck collective, a blocked write) shows every thread's stack before the kill
        faulthandler.dump_traceback_later(float(dump_after), exit=False)
    train(spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
