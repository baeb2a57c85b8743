"""Prefect task of the train stage: torchrun as a subprocess, the checkpoint as an MLflow LoggedModel."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from pydantic import BaseModel

from codemill import progress
from codemill.lineage import Lineage
from codemill.lineage import tags as T
from codemill.metrics.push import child_env
from codemill.models.config import TrainConfig
from codemill.models.launch import run_streaming, threads_per_rank, torchrun_command
from codemill.plan import StagePlan
from codemill.rl.algorithms.grpo import GRPOConfig
from codemill.store import ArtifactRef, ArtifactStore, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task

STAGE = "train"
TRAIN_CODE_VERSION = "train-v2"


def plan_train(cfg: TrainConfig, tokens: ArtifactRef, tokenizer: ArtifactRef) -> StagePlan:
    """The checkpoint depends on the train config and the token shards (which already hash the tokenizer). The
    tokenizer is an input too because the exported model ships it; its digest is part of the tokens' digest,
    so naming it changes nothing about what is trained."""
    return StagePlan(stage=STAGE, name="model", code_version=TRAIN_CODE_VERSION, config=cfg.digest_config(),
                     inputs={"tokens": tokens, "tokenizer": tokenizer})


def _summary(m: Manifest) -> dict[str, Any]:
    return {k: m.stats[k] for k in ("params", "steps", "tokens_seen", "final_loss", "first_loss")}


def _record(store: ArtifactStore, tokens: ArtifactRef):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        lineage.log_dataset_input(run_id, tokens, "training", name="tokens")
        ref = store.ref(m.stage, m.name, m.digest)
        model_id = lineage.find_model(m.digest)
        if model_id is None:
            hf_dir = store.local_path(ref) / "hf"
            model_id = lineage.log_checkpoint(run_id, ref, hf_dir, tokens, step=m.stats["steps"],
                                              params={"train": m.config})
        lineage.log_model_metric(run_id, "final_train_loss", m.stats["final_loss"], m.stats["steps"], model_id,
                                 tokens, "tokens")
        lineage.tag(run_id, {T.MODEL_ID: model_id})
        return {"model_id": model_id}
    return record


@stage_task("train")
def train_task(plan: StagePlan, ctx: RunContext, cfg: TrainConfig) -> StageResult:
    store = ctx.store()
    ref, tokens, tokenizer = store.ref_for(plan), plan.input("tokens"), plan.input("tokenizer")

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        from codemill.models.trainer import TrainSpec  # torch + transformers: only when a model is trained

        tok_dir = store.local_path(tokens)
        tok_stats = store.read_manifest(tokens).stats
        ckpt_dir = Path(ctx.work_dir).absolute() / "train" / f"{ref.name}-{ref.short}" / "checkpoints"
        spec = TrainSpec(train=cfg, tokens_dir=str(tok_dir / "train"),
                         tokenizer_dir=str(store.local_path(tokenizer)), out_dir=str(w.dir), ckpt_dir=str(ckpt_dir),
                         vocab_size=tok_stats["vocab_size"], eos_id=tok_stats["eos_id"], pad_id=tok_stats["pad_id"],
                         seq_len=tok_stats["seq_len"],
                         dataset_name="tokens", dataset_digest=tokens.digest)
        run_torchrun(spec, w.dir, cfg, ctx, run_id, STAGE)
        summary = json.loads((w.dir / "train_summary.json").read_text())
        stats = {k: summary[k] for k in ("params", "world_size", "steps", "tokens_per_step", "tokens_seen",
                                         "final_loss", "resumed_from", "wall_s", "parallelism")}
        stats["first_loss"] = summary["losses"][0] if summary["losses"] else None
        stats["best_step"] = summary.get("best_step")
        stats["attention"] = summary.get("attention")  # flex_attention (CUDA, block mask) or sdpa (dense mask)
        stats["val_losses"] = summary.get("val_losses", {})
        manifest = w.finish(stats)
        shutil.rmtree(ckpt_dir.parent, ignore_errors=True)  # the committed export supersedes them
        return manifest

    return run_stage(ctx, plan, produce, _record(store, tokens), _summary, gpus=_gpus(cfg), system_metrics=True)


def run_torchrun(spec: BaseModel, out_dir: Path, cfg: TrainConfig | GRPOConfig, ctx: RunContext, run_id: str,
                 stage: str, module: str = "codemill.models.trainer") -> None:
    """``module`` under torchrun with ``spec`` as its JSON argument (written beside ``out_dir``, removed after),
    rank 0 logging to the stage's MLflow run, its step lines shown as progress."""
    spec_path = out_dir.parent / f"{out_dir.name}.spec.json"
    spec_path.write_text(spec.model_dump_json())
    env = torchrun_env(cfg, ctx, run_id)
    progress.sink().stage(stage, f"torchrun x{cfg.nproc_per_node}")
    try:
        if isinstance(cfg, TrainConfig):  # multi-node settings are the trainer's
            cmd = torchrun_command(str(spec_path), cfg.nproc_per_node, nnodes=cfg.nnodes, module=module,
                                   max_restarts=cfg.max_restarts, rdzv_endpoint=cfg.rdzv_endpoint, rdzv_id=cfg.rdzv_id)
        else:
            cmd = torchrun_command(str(spec_path), cfg.nproc_per_node, module=module)
        run_streaming(cmd, env, cfg.timeout_s, on_line=trainer_line_handler(stage))
    finally:
        spec_path.unlink(missing_ok=True)


def torchrun_env(cfg: TrainConfig | GRPOConfig, ctx: RunContext, run_id: str | None) -> dict[str, str]:
    """The ranks' environment: MLflow (the stage run's id when there is one), one share of the cores per rank,
    unbuffered output, the stack dump before the timeout, and the flow run's metrics target."""
    from codemill.models.common import STACK_DUMP_ENV  # imports torch: only when something is trained

    return {**os.environ, "MLFLOW_TRACKING_URI": ctx.tracking_uri, **({"MLFLOW_RUN_ID": run_id} if run_id else {}),
            "OMP_NUM_THREADS": str(threads_per_rank(cfg.nproc_per_node)), "PYTHONUNBUFFERED": "1",
            "TQDM_DISABLE": "1", STACK_DUMP_ENV: str(max(1, cfg.timeout_s - 15)), **child_env()}


def trainer_line_handler(stage: str) -> Callable[[str], None]:
    """What a torchrun job's output lines do: step lines move the stage's progress (and log the loss), the rest
    is logged as it is."""
    logger = get_run_logger()
    return lambda line: _on_trainer_line(logger, line, stage)


def on_cuda(device: str) -> bool:
    """Whether a stage configured with ``device`` (auto | cpu | cuda) runs on CUDA here."""
    import torch

    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def _gpus(cfg: TrainConfig) -> int:
    """GPUs this node's ranks hold (one each) when training runs on CUDA."""
    return cfg.nproc_per_node if on_cuda(cfg.device) else 0


def _on_trainer_line(logger, line: str, stage: str) -> None:
    if line.startswith("{"):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            event = None
        if event and event.get("event") == "step" and "max_steps" in event:
            progress.sink().update(stage, event["step"], event["max_steps"])
            if "train_loss" in event:
                logger.info("step %d/%d loss %.4f lr %.2e %.0f tok/s", event["step"], event["max_steps"],
                            event["train_loss"], event["lr"], event["tokens_per_s"])
                return
    logger.info("%s", line)
