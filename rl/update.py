"""The GRPO update of one RL iteration: ``python -m torch.distributed.run ... -m codemill.rl.update SPEC.json``
(``launch.torchrun_command(..., module="codemill.rl.update")``), the one training loop (``models.trainer``) running
``rl.algorithms.grpo.GRPOObjective`` on an ``RLUpdateSpec``.

What is RL's lives here. ``RolloutSamples``: every rank reads the whole rollouts table, computes the group
advantages, applies dynamic sampling and overlong masking (``plan_update``) and walks the kept samples in a seeded
order (``SampleOrder``): the samples of a step are a pure function of (seed, step), so the data cursor is the step
and a SIGKILLed update resumes exactly from its last committed DCP checkpoint (model, optimizer, scheduler, step,
RNG, the metric history), which must carry this update's ``fingerprint``. ``PolicyFolders``: the policy read from
``policy_dir`` with the previous update's AdamW state, or held in memory by a long-lived worker
(``KeptPolicy``, ``rl.update_workers``), and the updated one written out.

Output: the updated policy in Hugging Face format (model + the policy's tokenizer files + ``update_summary.json``)
at ``out_dir``, written under a staging name and renamed into place last, so a killed run never leaves a
complete-looking export. Stdout: ``{"event": "start"}``, one ``{"event": "step"}`` per optimizer step, one
``{"event": "checkpoint"}`` per committed checkpoint and ``{"event": "done", "metrics": {...}}``. If no group
survives dynamic sampling the policy is exported unchanged (``steps`` 0, ``groups_kept`` 0, ``skipped`` says why).
The DCP checkpoints in ``ckpt_dir`` are resume scratch: the caller deletes them once the export is committed.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from codemill.models.build import build_like, load_pretrained
from codemill.models.checkpoint import Checkpointer, committed_steps, step_dir
from codemill.models.common import full_state_dict
from codemill.models.trainer import main, run
from codemill.rl.algorithms.grpo import (
    SUMMARY,
    GRPOConfig,
    GRPOObjective,
    RLUpdateSpec,
    Sample,
    dealt,
    dynamic_sampling_keep,
    group_advantages,
    overlong_keep,
    zero_variance_groups,
)

if TYPE_CHECKING:
    import torch

    from codemill.models.core import TrainingCore
    from codemill.models.parallel import Dist

__all__ = ["SUMMARY", "KeptPolicy", "PolicyFolders", "RLUpdateSpec", "RolloutSamples", "SampleOrder", "UpdatePlan",
           "fingerprint", "grpo_update", "plan_update", "update", "write_policy"]

ROLLOUT_COLUMNS = ["group", "sample", "prompt_ids", "completion_ids", "loss_mask", "logprobs", "turn_starts",
                   "turn_finish_reasons", "finish_reason", "reward"]
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


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
        """This rank's micro-batches of the step (``grpo.dealt``): every rank gets the same count (some may be
        empty)."""
        rows = self.step_rows(step)
        return [rows[r.start:r.stop:r.step] for r in dealt(len(rows), rank, world, micro_batch)]


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


class RolloutSamples:
    """An iteration's rollouts table as a GRPO update's samples (``grpo.StepSamples``): planned on every rank,
    walked in the seeded ``SampleOrder``."""

    def __init__(self, spec: RLUpdateSpec) -> None:
        self.spec = spec

    def open(self, per_step: int) -> int:
        cfg = self.spec.grpo
        self.plan = plan_update(read_rollouts(Path(self.spec.rollouts_path)), cfg, self.spec.max_new_tokens)
        self.order = SampleOrder(len(self.plan.samples), cfg.seed, per_step, cfg.epochs)
        return self.order.total_steps

    @property
    def stats(self) -> dict[str, float]:
        return self.plan.stats

    @property
    def max_new_tokens(self) -> int:
        return self.plan.max_new_tokens

    @property
    def top_token(self) -> int:
        return max((max(s.prompt_ids + s.completion_ids) for s in self.plan.samples), default=0)

    def fingerprint(self, world: int) -> str:
        return fingerprint(self.spec, world)

    def step(self, step: int) -> list[Sample] | None:
        if step >= self.order.total_steps:
            return None
        return [self.plan.samples[i] for i in self.order.step_rows(step).tolist()]


@dataclass(frozen=True)
class KeptPolicy:
    """A policy and its AdamW state as an update left them, held in memory by a long-lived update worker
    (``rl.update_workers``) for the update that continues from it: ``key`` names the artifact they were exported
    as. Restoring them is what ``continue_optimizer`` does from the artifact's optimizer checkpoint, without
    the disk."""

    key: str
    model: dict[str, Any]
    optim: dict[str, Any]


class PolicyFolders:
    """Where an update's policy comes from and goes (``grpo.PolicyStore``): read from ``policy_dir`` with the
    previous update's AdamW state from ``optimizer_in``, or, in a long-lived worker, the policy and state it holds
    (``kept``); written to ``out_dir`` (``write_policy``) with its AdamW state to ``optimizer_out``."""

    def __init__(self, spec: RLUpdateSpec, kept: KeptPolicy | None = None) -> None:
        self.spec, self.kept = spec, kept
        self.trained: KeptPolicy | None = None

    @property
    def from_memory(self) -> bool:
        return self.kept is not None

    def load(self, d: Dist) -> torch.nn.Module:
        """The policy's weights, or seeded random ones when the kept weights are set next."""
        spec = self.spec
        model = (build_like(spec.policy_dir, seed=spec.grpo.seed) if self.kept is not None
                 else load_pretrained(spec.policy_dir, seed=spec.grpo.seed))
        return model.to(d.device)

    def carry_over(self, core: TrainingCore) -> None:
        if self.kept is not None:
            self.restore(core, self.kept)
        else:
            self.continue_optimizer(core)

    def continue_optimizer(self, core: TrainingCore) -> None:
        """AdamW's moments from the previous iteration's update. One policy trained over many iterations is one
        optimisation (verl and TRL keep their optimizer across steps): a fresh AdamW makes its first steps
        about lr * sign(gradient) on every weight, noise included, which on a small model undid more than
        each iteration's signal taught."""
        root = Path(self.spec.optimizer_in) if self.spec.optimizer_in else None
        if root is None or not committed_steps(root):
            return
        from torch.distributed.checkpoint import load as dcp_load
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(core.model, core.opt)
        state: dict[str, Any] = {"model": msd, "optim": osd}
        dcp_load(state, checkpoint_id=str(step_dir(root, committed_steps(root)[-1]) / "dcp"))
        self.restore(core, KeptPolicy("", state["model"], state["optim"]))

    def restore(self, core: TrainingCore, kept: KeptPolicy) -> None:
        """Weights and AdamW moments of the previous update, then this update's learning-rate schedule (not the
        saved learning rates)."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(core.model, core.opt, model_state_dict=kept.model, optim_state_dict=kept.optim)
        for group in core.opt.param_groups:
            group["initial_lr"] = self.spec.grpo.lr
            group["lr"] = self.spec.grpo.lr * core.sched.lr_lambdas[0](0)

    def export(self, core: TrainingCore, summary: dict[str, Any]) -> None:
        """The optimizer state committed under ``optimizer_out``, the trained state kept for ``keep``, the weights
        gathered (a collective under FSDP) and written by rank 0."""
        spec, d = self.spec, core.d
        if spec.optimizer_out is not None:
            Checkpointer(Path(spec.optimizer_out), d.rank, 1, d.barrier).save(0, core.model, core.opt, core.sched, {})
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.trained = KeptPolicy("", *get_state_dict(core.model, core.opt))
        state = full_state_dict(core.model)
        if d.rank == 0:
            fresh: Any = build_like(spec.policy_dir, seed=spec.grpo.seed)  # every weight is set next
            fresh.load_state_dict(state)
            write_policy(fresh, Path(spec.policy_dir), Path(spec.out_dir), summary)

    def unchanged(self, summary: dict[str, Any]) -> None:
        """The policy copied through, and its optimizer state."""
        spec = self.spec
        write_policy(None, Path(spec.policy_dir), Path(spec.out_dir), summary)
        if spec.optimizer_in and spec.optimizer_out and Path(spec.optimizer_in).is_dir():
            shutil.copytree(spec.optimizer_in, spec.optimizer_out, dirs_exist_ok=True)

    def keep(self, key: str) -> KeptPolicy | None:
        """What a long-lived worker holds for the next update once this one's export is named ``key``: the
        trained state, or when the update trained nothing the state it started from (None if that was read
        from disk)."""
        state = self.trained or self.kept
        return replace(state, key=key) if state is not None else None


def grpo_update(spec: RLUpdateSpec, policy: PolicyFolders | None = None) -> GRPOObjective:
    """GRPO's objective on ``spec``'s rollouts, its policy read and written through ``policy`` (default: from and
    to ``spec``'s folders)."""
    return GRPOObjective(spec.grpo, RolloutSamples(spec), policy or PolicyFolders(spec), spec.ckpt_dir,
                         spec.reference_dir)


def update(spec: RLUpdateSpec) -> dict[str, Any]:
    return run(grpo_update(spec))


def from_spec_file(path: Path) -> GRPOObjective:
    return grpo_update(RLUpdateSpec.model_validate_json(path.read_text()))


if __name__ == "__main__":
    raise SystemExit(main(objective=from_spec_file, prog="codemill.rl.update"))
