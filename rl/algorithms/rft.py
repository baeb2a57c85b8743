"""Rejection sampling (``rl.algorithm: {name: rft, ...}``): each iteration fine-tunes the policy, with the
pipeline's trainer under torchrun, on its distinct passing samples, token ids exactly as sampled
(``rl.data.passing_documents``). The warm start before iteration 0 is the same fine-tune on reference solutions
(``finetune_job``). No loss mask: single-turn environments only.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from codemill.models.config import FinetuneConfig, TrainConfig
from codemill.rl.algorithms.base import AlgorithmSettings, UpdateInputs, UpdateJob

if TYPE_CHECKING:
    from codemill.rl.config import RLConfig



class RFTConfig(FinetuneConfig, AlgorithmSettings):
    """Rejection sampling: each iteration fine-tunes on its distinct passing samples (``codemill.rl.algorithms.rft``,
    the pipeline's trainer). Single-turn environments only: the documents have no loss mask."""

    name: Literal["rft"] = "rft"
    multi_turn: ClassVar[bool] = False  # whole documents, no loss mask
    epochs: float | None = Field(2.0, gt=0, description="Passes over the packed rows of the passing samples "
                                 "(rounded up, at most max_steps): the data grows and shrinks with the pass rate, "
                                 "and a fixed step count would overfit a few passing samples.")
    lr: float = Field(3e-4, gt=0, description="Peak learning rate (cosine decay to train.min_lr_ratio of it; the "
                                              "other AdamW settings are train's).")

    def check_rl(self, rl: RLConfig) -> None:
        """Any environment with one turn (the single-turn rule above is checked for every rule)."""


def finetune_train_config(train: TrainConfig, ft: FinetuneConfig, seed: int) -> TrainConfig:
    """The pipeline's trainer settings (parallelism, ranks, device, dtype) with the fine-tune's steps and lr.
    ``init_from`` (the policy folder) is set at run time: the policy is an input of the plan, not a path."""
    return train.model_copy(update={
        "init_from": None, "max_steps": ft.max_steps, "lr": ft.lr, "warmup_steps": min(ft.warmup_steps, ft.max_steps),
        "micro_batch_size": ft.micro_batch_size, "grad_accum_steps": 1, "seed": seed, "val_sequences": 0,
        "checkpoint_every": max(1, ft.max_steps), "schedule": "cosine"})


def finetune_job(name: str, docs: Sequence[Sequence[int]], ft: FinetuneConfig, train: TrainConfig,
                 config: dict[str, Any], policy_hf: str, data: tuple[str, str], out_dir: Path,
                 scratch: Path) -> UpdateJob | dict[str, Any]:
    """The trainer on ``docs`` (token documents) from ``policy_hf``, or, with no documents or no steps, the policy
    copied unchanged (and the stats say so). ``data``: the (name, digest) of what the documents came from."""
    from transformers import AutoTokenizer

    from codemill.models.trainer import TrainSpec
    from codemill.rl.data import finetune_steps, write_sft_tokens

    if not docs or ft.max_steps == 0:
        shutil.copytree(policy_hf, out_dir / "hf")
        return {"algorithm": name, "documents": len(docs), "steps": 0, "unchanged": True}
    tokenizer = AutoTokenizer.from_pretrained(policy_hf)
    tokenizer.save_pretrained(str(scratch / "tokenizer" / "hf"))
    info = write_sft_tokens(docs, tokenizer, ft.seq_len, scratch / "tokens", seed=config["train"]["seed"])
    tcfg = TrainConfig.model_validate({**train.model_dump(), **config["train"], "init_from": policy_hf})
    steps = finetune_steps(ft.max_steps, ft.epochs, info["rows"], tcfg.micro_batch_size * tcfg.nproc_per_node)
    tcfg = tcfg.model_copy(update={**{k: getattr(train, k) for k in ("timeout_s", "log_every", "keep_checkpoints")},
                                   "max_steps": steps, "checkpoint_every": steps,
                                   "warmup_steps": min(tcfg.warmup_steps, steps - 1)})
    spec = TrainSpec(train=tcfg, tokens_dir=str(scratch / "tokens" / "train"),
                     tokenizer_dir=str(scratch / "tokenizer"), out_dir=str(out_dir),
                     ckpt_dir=str(scratch / "checkpoints"),
                     vocab_size=info["vocab_size"], eos_id=info["eos_id"], pad_id=info["pad_id"], seq_len=ft.seq_len,
                     dataset_name=data[0], dataset_digest=data[1])

    def result() -> dict[str, Any]:
        summary = json.loads((out_dir / "train_summary.json").read_text())
        return {"algorithm": name, "documents": info["documents"], "tokens": info["tokens"], "rows": info["rows"],
                "steps": summary["steps"], "final_loss": summary["final_loss"],
                "first_loss": summary["losses"][0] if summary["losses"] else None, "unchanged": False}

    return UpdateJob(spec, tcfg, "codemill.models.trainer", result)


class RFT:
    name: ClassVar[str] = "rft"
    settings: ClassVar[type[AlgorithmSettings]] = RFTConfig

    def update_config(self, rl: RLConfig, train: TrainConfig, iteration: int, seed: int) -> dict[str, Any]:
        assert isinstance(rl.algorithm, RFTConfig)
        ft = finetune_train_config(train, rl.algorithm, seed)
        return {"algorithm": self.name, "train": ft.digest_config(), "seq_len": rl.algorithm.seq_len,
                "iteration": iteration}

    def launch_config(self, rl: RLConfig, train: TrainConfig) -> TrainConfig:
        return train

    def job(self, inputs: UpdateInputs) -> UpdateJob | dict[str, Any]:
        from transformers import AutoTokenizer

        from codemill.rl.data import passing_documents
        from codemill.rl.trajectory import read_rollouts

        assert isinstance(inputs.rl.algorithm, RFTConfig)
        eos = AutoTokenizer.from_pretrained(inputs.policy_hf).eos_token_id
        docs = passing_documents(read_rollouts(inputs.rollouts_path).to_pylist(), {eos})
        return finetune_job(self.name, docs, inputs.rl.algorithm, inputs.train, inputs.config, inputs.policy_hf,
                            (inputs.rollouts_name, inputs.rollouts_digest), inputs.out_dir, inputs.scratch)


ALGORITHM = RFT()
