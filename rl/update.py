"""The GRPO policy update of one RL iteration: ``python -m torch.distributed.run ... -m codemill.rl.update
SPEC.json`` (launched like the trainer: ``launch.torchrun_command(..., module="codemill.rl.update")``).

SPEC is an ``RLUpdateSpec``. Every rank reads the whole rollouts table, computes the group advantages, applies
dynamic sampling and overlong masking, and walks the kept samples in a seeded order (``SampleOrder``): the
samples of a step are a pure function of (seed, step), so the data cursor is the step and a SIGKILLed update
resumes exactly from its last committed DCP checkpoint (model, optimizer, scheduler, step, RNG, the metric
history). The loss of a step is normalised by the whole step's count (tokens or sequences) across micro-batches
and ranks, so micro-batching and sharding do not change the gradient. DDP or FSDP2 over gloo (CPU) or nccl
(CUDA), reusing the trainer's modules.

Output: the updated policy in Hugging Face format (model + the policy's tokenizer files + ``update_summary.json``)
at ``out_dir``, written under a staging name and renamed into place last, so a killed run never leaves a
complete-looking export. Stdout: ``{"event": "start"}``, one ``{"event": "step"}`` per optimizer step, and
``{"event": "done", "metrics": {...}}``. If no group survives dynamic sampling the policy is exported unchanged
(``steps`` 0, ``groups_kept`` 0, ``skipped`` says why). The DCP checkpoints in ``ckpt_dir`` are resume scratch:
the caller deletes them once the export is committed.

Metrics (the done line and ``update_summary.json``; the same keys when skipped):
  selection   samples, samples_kept, samples_truncated, turns_truncated (turns before an episode's last cut at
              max_new_tokens: no loss with overlong masking), groups, groups_kept (groups with a sample that trained),
              groups_zero_variance, groups_dropped (by dynamic sampling), adv_abs_mean
  loss        loss (the optimised objective), pg_loss (its clipped policy part): means over steps
  per token   kl (kl_ref with a reference, else kl_old), kl_old (k3 KL of the current policy to the sampling
              one, before each step's update), kl_ref (k3 KL to the reference; 0 without one), entropy,
              clip_frac_low, clip_frac_high, ratio_mean: token-weighted over steps; ratio_min, ratio_max
  optimiser   grad_norm (mean of the pre-clip norms), grad_norm_max, lr (the last step's), steps, tokens (loss
              tokens over all steps and epochs)
  time        update_s (this process), tokens_per_s (tokens of the steps this process ran / update_s),
              resumed_from (the step it resumed at, 0 for a fresh run)
A step line carries step, max_steps (as the trainer's, for the launcher's progress), samples and the per-token,
loss and optimiser values of that one step.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field, model_validator

from codemill.metrics.push import rank_pusher
from codemill.metrics.training import count_step, record_step
from codemill.models import parallel
from codemill.models.build import build_like, load_pretrained
from codemill.models.checkpoint import Checkpointer, committed_steps, step_dir
from codemill.models.common import emit, full_state_dict, run_rank, start_rank
from codemill.models.core import Optimization, TrainingCore
from codemill.rl.algorithms.grpo import (
    SUM_KEYS,
    MicroBatch,
    aggregate,
    collate,
    dynamic_sampling_keep,
    group_advantages,
    metrics_from_sums,
    overlong_keep,
    ratio_extremes,
    sequence_logprobs,
    step_denominator,
    token_sums,
    token_terms,
    zero_variance_groups,
)
from codemill.rl.config import GRPOConfig

ROLLOUT_COLUMNS = ["group", "sample", "prompt_ids", "completion_ids", "loss_mask", "logprobs", "turn_starts",
                   "turn_finish_reasons", "finish_reason", "reward"]
SUMMARY = "update_summary.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


class RLUpdateSpec(BaseModel):
    """What the rl flow's update task hands the torchrun job (written to SPEC.json)."""

    model_config = ConfigDict(extra="forbid")

    grpo: GRPOConfig
    policy_dir: str = Field(description="HF folder (model + tokenizer): the sampling policy, the initial weights.")
    reference_dir: str | None = Field(None, description="HF folder of the frozen KL reference; None = no KL term "
                                                        "(kl_coef must then be 0).")
    rollouts_path: str = Field(description="This iteration's rollouts.parquet (docs/rl.md#rollouts-table).")
    out_dir: str = Field(description="Where the updated policy is exported (HF format), atomically.")
    ckpt_dir: str = Field(description="Resumable DCP checkpoints of this update (scratch).")
    max_new_tokens: int | None = Field(None, gt=0, description="The rollout's max_new_tokens: Dr. GRPO's constant "
                                                               "normaliser; None = the longest completion.")
    optimizer_in: str | None = Field(None, description="The previous update's optimizer state (a checkpoint "
                                                       "folder written through optimizer_out); None = a fresh AdamW.")
    optimizer_out: str | None = Field(None, description="Where the optimizer state after this update is saved "
                                                        "(DCP), for the next iteration's update to continue from.")

    @model_validator(mode="after")
    def _kl_needs_a_reference(self) -> RLUpdateSpec:
        """Refused before torchrun starts, not by every rank after it."""
        if self.grpo.kl_coef and self.reference_dir is None:
            raise ValueError("grpo.kl_coef > 0 needs a reference_dir (the frozen KL reference)")
        return self


@dataclass(frozen=True)
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]  # every token after the prompt: sampled (loss_mask 1) and observed (0)
    logprobs: list[float]
    advantage: float
    loss_mask: list[int]

    @property
    def loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class UpdatePlan:
    """The kept samples (table order) and the counts that describe the selection."""

    samples: list[Sample]
    stats: dict[str, float]
    max_new_tokens: int


def read_rollouts(path: Path) -> dict[str, list]:
    """The columns the update needs, as Python lists (every rank reads the whole, small, table)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=ROLLOUT_COLUMNS)
    return table.to_pydict()


def truncated_turns(starts: list[int], reasons: list[str], length: int) -> list[tuple[int, int]]:
    """The spans of ``completion_ids`` (a turn's sampled tokens and the observation after them) of the turns
    before the last that were cut at ``max_new_tokens``; the last turn's cut is the episode's ``finish_reason``."""
    ends = [*starts[1:], length]
    return [(starts[t], ends[t]) for t in range(len(starts) - 1) if reasons[t] == "length"]


def plan_update(table: dict[str, list], cfg: GRPOConfig, max_new_tokens: int | None = None) -> UpdatePlan:
    """Advantages over whole groups (truncated samples included: they are part of the group's baseline), then the
    samples that get a loss: groups that survive dynamic sampling, episodes that were not truncated (overlong
    masking), and that have at least one token to train on. With overlong masking a turn cut at
    ``max_new_tokens`` before an episode's last gets no loss either: the environment answered a cut-off program,
    and the episode's reward says nothing about how that turn should have ended."""
    rewards = np.asarray(table["reward"], dtype=np.float64)
    groups = np.asarray(table["group"])
    n = len(rewards)
    for i in range(n):
        if not len(table["completion_ids"][i]) == len(table["logprobs"][i]) == len(table["loss_mask"][i]):
            raise ValueError(f"rollout row {i} (group {groups[i]}, sample {table['sample'][i]}): "
                             f"{len(table['completion_ids'][i])} completion tokens but "
                             f"{len(table['logprobs'][i])} log-probs and {len(table['loss_mask'][i])} mask values")
    adv = group_advantages(rewards, groups, norm_by_std=cfg.norm_adv_by_std)
    zero_var = zero_variance_groups(rewards, groups)
    keep = np.ones(n, dtype=bool)
    if cfg.dynamic_sampling:
        keep &= dynamic_sampling_keep(rewards, groups)
    truncated = ~overlong_keep(table["finish_reason"])
    if cfg.overlong_mask:
        keep &= ~truncated
    masks = [list(m) for m in table["loss_mask"]]
    cut_turns = 0
    for i in range(n):
        for a, b in truncated_turns(table["turn_starts"][i], table["turn_finish_reasons"][i], len(masks[i])):
            cut_turns += 1
            if cfg.overlong_mask:
                masks[i][a:b] = [0] * (b - a)
    keep &= np.array([sum(m) > 0 for m in masks], dtype=bool)
    samples = [Sample(list(table["prompt_ids"][i]), list(table["completion_ids"][i]), list(table["logprobs"][i]),
                      float(adv[i]), masks[i]) for i in np.flatnonzero(keep)]
    all_groups = set(groups.tolist())
    zv_groups = set(groups[zero_var].tolist())
    kept_groups = set(groups[keep].tolist())
    longest = max((sum(m) for m in table["loss_mask"]), default=1)
    stats = {"samples": n, "samples_kept": len(samples), "samples_truncated": int(truncated.sum()),
             "turns_truncated": cut_turns,
             "groups": len(all_groups), "groups_kept": len(kept_groups),
             "groups_zero_variance": len(zv_groups),
             "groups_dropped": len(zv_groups) if cfg.dynamic_sampling else 0,
             "adv_abs_mean": float(np.mean([abs(s.advantage) for s in samples])) if samples else 0.0}
    return UpdatePlan(samples, stats, max_new_tokens or max(longest, 1))


class SampleOrder:
    """Which kept samples each (step, rank, micro-step) trains on: epochs of seeded permutations cut into steps
    of ``per_step`` samples (the last step of an epoch may be short). A step's samples are dealt to ranks in
    turn, then cut into micro-batches, so a short step still spreads over every rank."""

    def __init__(self, n: int, seed: int, per_step: int, epochs: int) -> None:
        self.n, self.seed, self.per_step = n, seed, per_step
        self.steps_per_epoch = math.ceil(n / per_step) if n else 0
        self.total_steps = epochs * self.steps_per_epoch
        self._cache: tuple[int, np.ndarray] | None = None

    def step_rows(self, step: int) -> np.ndarray:
        epoch, part = divmod(step, self.steps_per_epoch)
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n))
        return self._cache[1][part * self.per_step:(part + 1) * self.per_step]

    def micro_rows(self, step: int, rank: int, world: int, micro_batch: int) -> list[np.ndarray]:
        """This rank's micro-batches of the step; every rank gets the same count (some may be empty)."""
        rows = self.step_rows(step)
        mine = rows[rank::world]
        count = math.ceil(math.ceil(len(rows) / world) / micro_batch)
        return [mine[m * micro_batch:(m + 1) * micro_batch] for m in range(count)]


def fingerprint(spec: RLUpdateSpec, world: int) -> str:
    """What a checkpoint must match to be resumed: the rollouts' bytes, the output-affecting config and the world
    size (the sample order depends on it). A different input with a stale ckpt_dir fails loudly instead of
    resuming someone else's update."""
    h = hashlib.sha256(Path(spec.rollouts_path).read_bytes())
    h.update(json.dumps({"grpo": spec.grpo.digest_config(), "world": world, "max_new_tokens": spec.max_new_tokens,
                         "reference": spec.reference_dir is not None}, sort_keys=True).encode())
    return h.hexdigest()


def policy_files(policy_dir: Path) -> list[Path]:
    """The policy folder's files other than weights (tokenizer, its special tokens, chat template...)."""
    return sorted(p for p in policy_dir.iterdir()
                  if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES) and p.name != SUMMARY)


def write_policy(model: Any | None, policy_dir: Path, out_dir: Path, summary: dict[str, Any]) -> None:
    """Export under ``.staging-<name>`` next to ``out_dir`` and rename it into place last. ``model`` None: the
    policy unchanged (its files copied). The tokenizer files are the policy's own."""
    staging = out_dir.parent / f".staging-{out_dir.name}"
    shutil.rmtree(staging, ignore_errors=True)
    if model is None:
        shutil.copytree(policy_dir, staging)
    else:
        staging.mkdir(parents=True)
        model.config.use_cache = True
        model.save_pretrained(str(staging), safe_serialization=True)
        for f in policy_files(policy_dir):
            if not (staging / f.name).exists():
                shutil.copy2(f, staging / f.name)
    (staging / SUMMARY).write_text(json.dumps(summary, indent=2))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.rename(staging, out_dir)


def summarize(history: list[dict[str, float]], plan_stats: dict[str, float]) -> dict[str, float]:
    """The done line's metrics from the per-step records: token-weighted means for the token metrics, the mean
    over steps for losses and grad norms, extremes for the ratio."""
    out: dict[str, float] = {**plan_stats, "steps": len(history)}
    tokens = sum(h["tokens"] for h in history)
    out["tokens"] = tokens
    for key in ("kl", "kl_old", "kl_ref", "entropy", "clip_frac_low", "clip_frac_high", "ratio_mean"):
        out[key] = sum(h[key] * h["tokens"] for h in history) / tokens if tokens else 0.0
    for key in ("loss", "pg_loss", "grad_norm"):
        out[key] = float(np.mean([h[key] for h in history])) if history else 0.0
    out["grad_norm_max"] = max((h["grad_norm"] for h in history), default=0.0)
    out["ratio_min"] = min((h["ratio_min"] for h in history), default=1.0)
    out["ratio_max"] = max((h["ratio_max"] for h in history), default=1.0)
    out["ratio_mean"] = out["ratio_mean"] if tokens else 1.0
    out["lr"] = history[-1]["lr"] if history else 0.0
    return out


@dataclass(frozen=True)
class KeptPolicy:
    """A policy and its AdamW state as an update left them, held in memory by a long-lived update worker
    (``rl.update_workers``) for the update that continues from it: ``key`` names the artifact they were exported
    as. Restoring them is what ``continue_optimizer`` does from the artifact's optimizer checkpoint, without
    the disk."""

    key: str
    model: dict[str, Any]
    optim: dict[str, Any]


class GRPOUpdate:
    """Setup in ``__init__``; ``run`` is the loop (one step, log, maybe checkpoint), then the export. ``kept``:
    the starting policy and optimizer in memory (a long-lived worker's), instead of the spec's folders."""

    def __init__(self, spec: RLUpdateSpec, kept: KeptPolicy | None = None) -> None:
        self.spec, self.cfg, self.kept = spec, spec.grpo, kept
        self.trained: KeptPolicy | None = None
        cfg = self.cfg
        self.started = time.perf_counter()
        self.core = TrainingCore.start(cfg.device)
        self.d = d = self.core.d
        self.plan = plan_update(read_rollouts(Path(spec.rollouts_path)), cfg, spec.max_new_tokens)
        per_step = d.world * cfg.micro_batch_size * cfg.grad_accum
        self.order = SampleOrder(len(self.plan.samples), cfg.seed, per_step, cfg.epochs)
        self.history: list[dict[str, float]] = []
        self.start_step = 0
        self.pusher = rank_pusher(d.rank) if d.rank == 0 else None  # when the flow run pushes metrics

    def run(self) -> dict[str, Any]:
        """Every step, then the export; ends with a barrier (the process group is left to ``run_rank``)."""
        d = self.d
        if self.order.total_steps == 0:
            return self.skip()
        self.setup_training()
        for step in range(self.start_step, self.order.total_steps):
            record = self.train_step(step)
            self.history.append(record)
            if d.rank == 0:
                count_step()
                record_step(record["loss"], record["grad_norm"], record["lr"])
                emit("step", **record)
            done = step + 1
            if done % self.cfg.checkpoint_every == 0 and done < self.order.total_steps:
                self.core.save(done, {"history": list(self.history), "fingerprint": self.fp})
        return self.finish()

    def skip(self) -> dict[str, Any]:
        """No sample survived the selection: export the policy unchanged, and say so."""
        stats = self.plan.stats
        if not stats["samples"]:
            reason = "the rollouts table is empty"
        elif self.cfg.dynamic_sampling and stats["groups_dropped"] == stats["groups"]:
            reason = "no group with distinct rewards survived dynamic sampling"
        else:
            reason = "no sample left to train on after overlong masking"
        metrics = summarize([], stats) | {"update_s": time.perf_counter() - self.started, "resumed_from": 0,
                                          "tokens_per_s": 0.0}
        summary = {"metrics": metrics, "skipped": reason, "history": []}
        if self.d.rank == 0:
            write_policy(None, Path(self.spec.policy_dir), Path(self.spec.out_dir), summary)
            if self.spec.optimizer_in and self.spec.optimizer_out and Path(self.spec.optimizer_in).is_dir():
                shutil.copytree(self.spec.optimizer_in, self.spec.optimizer_out, dirs_exist_ok=True)
            emit("done", metrics=metrics, skipped=reason)
            self.finish_metrics()
        self.d.barrier()
        return summary

    def finish_metrics(self) -> None:
        if self.pusher is not None:
            self.pusher.finish()

    def setup_training(self) -> None:
        cfg, d, spec = self.cfg, self.d, self.spec
        self.fp = fingerprint(spec, d.world)
        self.ckpt = self.core.open_checkpoints(spec.ckpt_dir, cfg.keep_checkpoints)
        bf16 = cfg.dtype == "bfloat16"
        model: Any = (build_like(spec.policy_dir, seed=cfg.seed) if self.kept is not None
                      else load_pretrained(spec.policy_dir, seed=cfg.seed))
        self.model = model.to(d.device)
        self.check_vocab(model)
        mcfg = model.config
        pad = mcfg.pad_token_id if mcfg.pad_token_id is not None else mcfg.eos_token_id
        self.pad_id = int(pad[0] if isinstance(pad, list) else pad or 0)
        total = self.order.total_steps
        self.core.attach(self.model, cfg.parallelism, cfg.dtype, Optimization(  # constant lr after the warmup
            cfg.lr, cfg.beta1, cfg.beta2, cfg.weight_decay, "wsd", cfg.warmup_steps, total, min_lr_ratio=1.0))
        self.module, self.opt, self.sched, self.autocast = (self.core.module, self.core.opt, self.core.sched,
                                                            self.core.autocast)
        self.ref: torch.nn.Module | None = None
        if spec.reference_dir is not None:
            ref = load_pretrained(spec.reference_dir, seed=cfg.seed).to(d.device).eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            self.ref = parallel.wrap(ref, "fsdp", d, bf16=bf16) if cfg.parallelism == "fsdp" else ref
        if self.kept is not None:
            self.restore_kept(self.kept)
        else:
            self.continue_optimizer()
        self.resume()
        if d.rank == 0:
            emit("start", world=d.world, device=str(d.device), parallelism=cfg.parallelism, steps=total,
                 start_step=self.start_step, from_memory=self.kept is not None, **self.plan.stats)

    def check_vocab(self, model: Any) -> None:
        vocab = model.get_input_embeddings().num_embeddings
        top = max((max(s.prompt_ids + s.completion_ids) for s in self.plan.samples), default=0)
        if top >= vocab:
            raise ValueError(f"the rollouts hold token id {top} but the policy's vocabulary has {vocab} entries: "
                             "rollouts and policy_dir do not belong together")

    def continue_optimizer(self) -> None:
        """AdamW's moments from the previous iteration's update. One policy trained over many iterations is one
        optimisation (verl and TRL keep their optimizer across steps): a fresh AdamW makes its first steps
        about lr * sign(gradient) on every weight, noise included, which on a small model undid more than
        each iteration's signal taught."""
        root = Path(self.spec.optimizer_in) if self.spec.optimizer_in else None
        if root is None or not committed_steps(root):
            return
        from torch.distributed.checkpoint import load as dcp_load
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.opt)
        state: dict[str, Any] = {"model": msd, "optim": osd}
        dcp_load(state, checkpoint_id=str(step_dir(root, committed_steps(root)[-1]) / "dcp"))
        self.restore_kept(KeptPolicy("", state["model"], state["optim"]))

    def restore_kept(self, kept: KeptPolicy) -> None:
        """Weights and AdamW moments of the previous update, then this update's learning-rate schedule (not the
        saved learning rates)."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.opt, model_state_dict=kept.model, optim_state_dict=kept.optim)
        for group in self.opt.param_groups:
            group["initial_lr"] = self.cfg.lr
            group["lr"] = self.cfg.lr * self.sched.lr_lambdas[0](0)

    def keep(self, key: str) -> KeptPolicy | None:
        """What a long-lived worker holds for the next update once this one's export is named ``key``: the
        trained state, or when the update trained nothing the state it started from (None if that was read
        from disk)."""
        state = self.trained or self.kept
        return replace(state, key=key) if state is not None else None

    def save_optimizer(self) -> None:
        """The optimizer state after this update, committed under ``optimizer_out`` (skip: copied through)."""
        if self.spec.optimizer_out is None:
            return
        out = Path(self.spec.optimizer_out)
        Checkpointer(out, self.d.rank, 1, self.d.barrier).save(0, self.model, self.opt, self.sched, {})

    def resume(self) -> None:
        """The last committed checkpoint's state (weights, optimizer, scheduler and RNG restored in place)."""
        saved = self.core.resume()
        if saved is None:
            return
        if saved.get("fingerprint") != self.fp:
            raise RuntimeError(f"{self.ckpt.root} holds a checkpoint of a different update (other rollouts, config "
                               "or world size); refusing to resume it. Delete the directory to start over.")
        self.history, self.start_step = list(saved["history"]), int(saved["step"])
        if self.d.rank == 0:
            emit("resumed", step=self.start_step)

    def micro_batch(self, rows: np.ndarray) -> MicroBatch:
        """This rank's rows, padded right; a rank with none this micro-step gets one masked dummy row, so every
        rank runs the same forwards and backwards (the collectives stay in step)."""
        samples = [self.plan.samples[i] for i in rows.tolist()]
        if not samples:
            return collate([[self.pad_id]], [[self.pad_id]], [[0.0]], [0.0], self.pad_id, trained=[False])
        return collate([s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                       [s.logprobs for s in samples], [s.advantage for s in samples], self.pad_id,
                       loss_masks=[s.loss_mask for s in samples])

    def train_step(self, step: int) -> dict[str, float]:
        """One optimizer step over the step's samples (accumulated over micro-batches, gradients synced on the
        last); returns the step's record (metrics reduced over ranks)."""
        cfg, d = self.cfg, self.d
        micros = self.order.micro_rows(step, d.rank, d.world, cfg.micro_batch_size)
        step_rows = self.order.step_rows(step)
        den = step_denominator(cfg.loss_agg, [self.plan.samples[i].loss_tokens for i in step_rows.tolist()])
        self.opt.zero_grad(set_to_none=True)
        sums = torch.zeros(len(SUM_KEYS) + 2, dtype=torch.float64)  # + the loss and the policy loss
        lo, hi = math.inf, -math.inf
        for m, rows in enumerate(micros):
            batch = self.micro_batch(rows).to(d.device)
            with parallel.set_grad_sync(self.module, cfg.parallelism, m == len(micros) - 1), self.autocast:
                logp, entropy = sequence_logprobs(self.module, batch.input_ids, batch.attention_mask,
                                                  cfg.temperature, batch.start, with_entropy=True,
                                                  entropy_grad=cfg.entropy_coef > 0)
                ref_logp = None
                if self.ref is not None:
                    with torch.no_grad():
                        ref_logp, _ = sequence_logprobs(self.ref, batch.input_ids, batch.attention_mask,
                                                        cfg.temperature, batch.start)
                terms = token_terms(logp, batch.old_logp, batch.advantages, clip_low=cfg.clip_low,
                                    clip_high=cfg.clip_high, kl_coef=cfg.kl_coef, ref_logp=ref_logp,
                                    entropy=entropy, entropy_coef=cfg.entropy_coef)
                loss = aggregate(terms.loss, batch.mask, cfg.loss_agg, max_new_tokens=self.plan.max_new_tokens,
                                 denominator=den)
                (loss * d.world).backward()  # DDP / FSDP average gradients over ranks: undo it, the
                # denominator already is the whole step's
            pg = aggregate(terms.pg_loss.detach(), batch.mask, cfg.loss_agg, max_new_tokens=self.plan.max_new_tokens,
                           denominator=den)
            sums += torch.cat([token_sums(terms, batch.mask).cpu(),
                               torch.tensor([float(loss.detach()), float(pg)], dtype=torch.float64)])
            r_lo, r_hi = ratio_extremes(terms, batch.mask)
            if batch.mask.sum() > 0:
                lo, hi = min(lo, r_lo), max(hi, r_hi)
        lr = float(self.sched.get_last_lr()[0])  # the step's own rate, before the schedule moves on
        grad_norm = self.core.step(cfg.grad_clip)
        extremes = torch.tensor([-lo, hi], dtype=torch.float64)
        if d.distributed:  # on the process group's device (nccl reduces CUDA tensors only)
            sums, extremes = sums.to(d.device), extremes.to(d.device)
            dist.all_reduce(sums)
            dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
            sums, extremes = sums.cpu(), extremes.cpu()
        tok = metrics_from_sums(sums[:len(SUM_KEYS)].tolist())
        kl = tok["kl_ref"] if self.ref is not None else tok["kl_old"]
        return {"step": step + 1, "max_steps": self.order.total_steps, "loss": float(sums[-2]),
                "pg_loss": float(sums[-1]), "kl": kl, **tok, "ratio_min": float(-extremes[0]),
                "ratio_max": float(extremes[1]), "grad_norm": grad_norm, "lr": lr, "samples": len(step_rows)}

    def finish(self) -> dict[str, Any]:
        """Export the updated weights (rank 0 writes; the state dict gather is a collective) and the summary."""
        d = self.d
        metrics = summarize(self.history, self.plan.stats)
        update_s = time.perf_counter() - self.started
        ran = self.history[self.start_step:]
        metrics |= {"update_s": update_s, "resumed_from": self.start_step,
                    "tokens_per_s": sum(h["tokens"] for h in ran) / update_s}
        summary = {"metrics": metrics, "history": self.history}
        self.save_optimizer()
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.trained = KeptPolicy("", *get_state_dict(self.model, self.opt))
        state = full_state_dict(self.model)
        if d.rank == 0:
            fresh: Any = build_like(self.spec.policy_dir, seed=self.cfg.seed)  # every weight is set next
            fresh.load_state_dict(state)
            write_policy(fresh, Path(self.spec.policy_dir), Path(self.spec.out_dir), summary)
            emit("done", metrics=metrics)
            self.finish_metrics()
        d.barrier()
        return summary


def update(spec: RLUpdateSpec) -> dict[str, Any]:
    return GRPOUpdate(spec).run()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m codemill.rl.update SPEC.json", file=sys.stderr)
        return 2
    start_rank()
    spec = RLUpdateSpec.model_validate_json(Path(argv[0]).read_text())
    return run_rank(lambda: update(spec))  # the process group is left to os._exit: see run_rank


if __name__ == "__main__":
    raise SystemExit(main())
