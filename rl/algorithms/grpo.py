"""GRPO: its pieces as pure functions (advantages, sample selection, per-token log-probs, the clipped loss, KL,
entropy, loss aggregation, the step metrics), its objective on the one training loop (``GRPOObjective``: the
samples of each step pulled from a ``StepSamples``, the policy read and written through a ``PolicyStore``), and
the update rule the rl flow runs (``GRPO``: the job ``codemill.rl.update`` runs under torchrun).

Sources, whose formulas these follow (differences are named where they occur):

* verl, ``verl/trainer/ppo/core_algos.py``: ``compute_grpo_outcome_advantage`` (group mean / unbiased std,
  ``norm_adv_by_std_in_grpo=False`` for Dr. GRPO), ``compute_policy_loss_vanilla`` (``clip_ratio_low`` /
  ``clip_ratio_high``, DAPO's clip-higher), ``agg_loss`` (token-mean, seq-mean-token-mean,
  seq-mean-token-sum-norm), ``kl_penalty`` ("low_var_kl" = k3) and ``compute_entropy_loss``.
* TRL, ``trl/trainer/grpo_trainer.py`` (``_compute_loss``): ``coef_1 = exp(logp - old_logp)``, ``coef_2 =
  clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)``, ``per_token_loss = -min(coef_1 * A, coef_2 * A) + beta *
  per_token_kl`` with ``per_token_kl = exp(ref - logp) - (ref - logp) - 1``; the ``dr_grpo`` loss type divides by
  ``batch * max_completion_length``; ``mask_truncated_completions``; the low/high clip-ratio metrics.
* DAPO (arXiv 2503.14476): clip-higher, dynamic sampling (drop groups whose rewards are all equal), overlong
  filtering (truncated completions get no loss), token-level loss. Dr. GRPO (arXiv 2503.20783): no std
  normalisation, a constant length normaliser.

Log-prob convention (``docs/rl.md#log-prob-convention``): ``log_softmax(logits.float() / temperature)[token]``,
the same in the sampler and here, so the importance ratio is exactly 1 before the first optimizer step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from codemill.lazy import lazy_module
from codemill.models.config import TrainConfig
from codemill.models.objective import Finished, LoopSettings, MicroBatches, Optimization, RunPlan
from codemill.rl.algorithms.base import AlgorithmSettings, UpdateInputs, UpdateJob
from codemill.stage_config import runtime_only

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from codemill.models import parallel
    from codemill.models.core import TrainingCore
    from codemill.models.parallel import Dist
    from codemill.rl.config import RLConfig
else:  # heavy, and only the update runs them: the rl config imports this module for its settings
    torch = lazy_module("torch")
    dist = lazy_module("torch.distributed")
    F = lazy_module("torch.nn.functional")
    parallel = lazy_module("codemill.models.parallel")

__all__ = ["GRPO", "SUMMARY", "SUM_KEYS", "GRPOConfig", "GRPOObjective", "LossAgg", "MicroBatch", "PolicyStore",
           "RLUpdateSpec", "Sample", "StepSamples", "TokenTerms", "aggregate", "collate", "dealt",
           "dynamic_sampling_keep", "entropy_from_logits", "group_advantages", "kl_k3", "metrics_from_sums",
           "overlong_keep", "ratio_extremes", "sequence_logprobs", "step_denominator", "summarize", "token_sums",
           "token_terms", "zero_variance_groups"]

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
STD_EPS = 1e-6  # verl's epsilon (TRL uses 1e-4); only groups with non-zero std are divided



class GRPOConfig(AlgorithmSettings):
    """The GRPO policy update of one RL iteration (``codemill.rl.update``; formulas in ``rl/algorithms/grpo.py``).

    Defaults follow DAPO as verl runs it (clip-higher 0.2/0.28, no KL, token-mean, dynamic sampling, overlong
    masking); ``norm_adv_by_std=False`` with ``loss_agg="seq-mean-token-sum-norm"`` is Dr. GRPO.
    """

    name: Literal["grpo"] = "grpo"
    multi_turn: ClassVar[bool] = True  # trains through the loss mask: episodes with environment tokens are fine

    clip_low: float = Field(0.2, ge=0, lt=1, description="Ratio clipped below at 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0, description="Ratio clipped above at 1 + clip_high (DAPO clip-higher).")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL to the frozen reference (0 = off).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight (0 = off).")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="Loss aggregation over the tokens of a step; seq-mean-token-sum-norm divides "
                                  "each completion's token sum by max_new_tokens (Dr. GRPO).")
    norm_adv_by_std: bool = Field(True, description="Divide advantages by the group's reward std (False: "
                                                    "Dr. GRPO).")
    dynamic_sampling: bool = Field(True, description="Drop groups whose rewards are all equal (DAPO).")
    overlong_mask: bool = Field(True, description="Truncated completions (finish_reason length) get no loss.")
    temperature: float = Field(1.0, gt=0, description="The rollout's sampling temperature (log-probs are "
                                                      "log_softmax(logits / temperature)).")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate (constant after warmup).")
    warmup_steps: int = Field(0, ge=0, description="Linear lr warmup within the update.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay of the weight matrices (norms and "
                                                       "biases are not decayed).")
    beta1: float = Field(0.9, gt=0, lt=1, description="AdamW first-moment (momentum) decay rate.")
    beta2: float = Field(0.999, gt=0, lt=1, description="AdamW second-moment decay rate.")
    grad_clip: float = Field(1.0, gt=0, description="Clip the global gradient L2 norm to this before each "
                                                    "optimizer step.")
    epochs: int = Field(1, gt=0, description="Passes over the kept samples.")
    micro_batch_size: int = Field(4, gt=0, description="Samples per rank per micro-step.")
    grad_accum: int = Field(1, gt=0, description="Micro-steps per optimizer step (samples per step = ranks x "
                                                 "micro_batch_size x grad_accum).")
    seed: int = Field(1234, description="Seeds the sample order.")
    parallelism: Literal["ddp", "fsdp"] = Field("ddp", description="DDP, or FSDP2 (fully_shard per block).")
    nproc_per_node: int = Field(2, ge=1, description="torchrun processes per node.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Autocast / FSDP param dtype (GPU).")
    checkpoint_every: int = runtime_only(default=4, gt=0, description="Steps between resumable checkpoints.")
    keep_checkpoints: int = runtime_only(default=1, ge=1, description="Committed checkpoints kept.")
    timeout_s: int = runtime_only(default=3600, gt=0, description="Kill the torchrun job after this long.")
    workers: Literal["run", "update"] = runtime_only(
        default="run", description="run: one torchrun group serves every update of the RL run and keeps the policy "
        "and its optimizer in memory between them; update: torchrun started for each update. Same results.")

    def check_rl(self, rl: RLConfig) -> None:
        """The update's log-probs must use the temperature the samples were drawn at (the ratio starts at 1)."""
        if self.temperature != rl.rollout.temperature:
            raise ValueError(f"algorithm.temperature ({self.temperature}) must equal rollout.temperature "
                             f"({rl.rollout.temperature}): the update scores tokens at the sampling temperature")


def _group_index(groups: Sequence | np.ndarray) -> tuple[np.ndarray, int]:
    """Dense 0..G-1 ids for arbitrary group labels, and G."""
    _, inverse = np.unique(np.asarray(groups), return_inverse=True)
    inverse = inverse.reshape(-1)
    return inverse, int(inverse.max()) + 1 if inverse.size else 0


def zero_variance_groups(rewards: Sequence[float] | np.ndarray, groups: Sequence | np.ndarray) -> np.ndarray:
    """Per row: True when every reward of the row's group is equal (a group of one included). Such a group has
    no learning signal: every advantage in it is 0."""
    r = np.asarray(rewards, dtype=np.float64)
    idx, n = _group_index(groups)
    lo = np.full(n, np.inf)
    hi = np.full(n, -np.inf)
    np.minimum.at(lo, idx, r)
    np.maximum.at(hi, idx, r)
    return (lo == hi)[idx]


def group_advantages(rewards: Sequence[float] | np.ndarray, groups: Sequence | np.ndarray, *,
                     norm_by_std: bool = True, eps: float = STD_EPS) -> np.ndarray:
    """GRPO's outcome advantage per row: (r - mean of its group) / (std of its group + eps), float64.

    The std is the unbiased one (``torch.std`` in verl, ``.std(dim=1)`` in TRL). ``norm_by_std=False`` is Dr. GRPO
    (r - mean only). A group of size 1 or with all rewards equal gets exactly 0 (verl gives a lone sample its raw
    reward; here a lone sample has no baseline, so no signal)."""
    r = np.asarray(rewards, dtype=np.float64)
    idx, n = _group_index(groups)
    count = np.bincount(idx, minlength=n).astype(np.float64)
    mean = np.bincount(idx, weights=r, minlength=n) / np.maximum(count, 1)
    centred = r - mean[idx]
    if norm_by_std:
        var = np.bincount(idx, weights=centred ** 2, minlength=n) / np.maximum(count - 1, 1)
        centred = centred / (np.sqrt(var)[idx] + eps)
    return np.where(zero_variance_groups(r, groups), 0.0, centred)


def dynamic_sampling_keep(rewards: Sequence[float] | np.ndarray, groups: Sequence | np.ndarray) -> np.ndarray:
    """Per row: True when its group survives DAPO's dynamic sampling (its rewards are not all equal)."""
    return ~zero_variance_groups(rewards, groups)


def overlong_keep(finish_reasons: Sequence[str]) -> np.ndarray:
    """Per row: True unless the episode was truncated: its last turn cut at max_new_tokens (finish_reason
    "length") or the episode cut on a limit (``max_tokens``, ``wall_time``); DAPO's overlong filtering, TRL's
    ``mask_truncated_completions`` and DeepSWE's compact filtering give those no loss (their reward says
    nothing about an episode that never ended)."""
    from codemill.rl.trajectory import TRUNCATED_REASONS  # heavy: it reads the engines' finish reasons (torch)

    return np.array([f not in TRUNCATED_REASONS for f in finish_reasons], dtype=bool)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical at each position (verl ``entropy_from_logits``): logsumexp - sum p * logit."""
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def sequence_logprobs(module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      temperature: float, start: int = 0, with_entropy: bool = False,
                      entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of ``input_ids[:, start + 1:]`` under a causal LM, the contract's convention
    (``log_softmax(logits.float() / temperature)``); column j is the token at position ``start + 1 + j``.

    ``start`` skips the prompt positions no row trains on (logits are computed for all of them anyway, but the
    vocab-sized softmax is not). With ``with_entropy`` also the entropy of each of those distributions, in the
    autograd graph only with ``entropy_grad`` (an entropy bonus): as a metric it would hold a vocab-sized tensor."""
    logits = module(input_ids=input_ids, attention_mask=attention_mask).logits
    logits = logits[:, start:-1].float() / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, input_ids[:, start + 1:, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per sampled token: exp(ref - logp) - (ref - logp) - 1 (>= 0,
    unbiased, low variance); verl's "low_var_kl" (with its +-20 / +-10 clamps) and TRL's ``per_token_kl``."""
    d = torch.clamp(ref_logp - logp, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(d) - d - 1.0, min=-10.0, max=10.0)


@dataclass
class TokenTerms:
    """Per-token matrices (B, L) of one micro-batch: the objective to aggregate and what the metrics read."""

    loss: torch.Tensor  # the per-token objective: clipped policy loss + kl_coef * k3 - entropy_coef * entropy
    pg_loss: torch.Tensor
    ratio: torch.Tensor
    clipped_low: torch.Tensor  # ratio < 1 - clip_low with A < 0: the clipped term is active, no gradient
    clipped_high: torch.Tensor  # ratio > 1 + clip_high with A > 0
    kl_old: torch.Tensor  # k3 KL(pi_theta || pi_old), detached: how far the update has moved
    kl_ref: torch.Tensor | None
    entropy: torch.Tensor | None


def token_terms(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, *, clip_low: float,
                clip_high: float, kl_coef: float = 0.0, ref_logp: torch.Tensor | None = None,
                entropy: torch.Tensor | None = None, entropy_coef: float = 0.0) -> TokenTerms:
    """The clipped surrogate per token, ratio = exp(logp - old_logp):
    ``max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))`` (verl ``compute_policy_loss_vanilla``
    without dual-clip; TRL ``-min(coef_1 * A, coef_2 * A)``). ``advantages`` is per sequence (B,) or per token."""
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    adv = adv.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high))
    loss = pg
    kl_ref = None
    if ref_logp is not None:
        kl_ref = kl_k3(logp, ref_logp)
        if kl_coef:
            loss = loss + kl_coef * kl_ref
    if entropy is not None and entropy_coef:
        loss = loss - entropy_coef * entropy
    with torch.no_grad():
        low = (ratio < 1.0 - clip_low) & (adv < 0)
        high = (ratio > 1.0 + clip_high) & (adv > 0)
        kl_old = kl_k3(logp, old_logp)
    return TokenTerms(loss, pg, ratio, low, high, kl_old, kl_ref, entropy)


def _seq_sums(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum(-1)


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: LossAgg, *, max_new_tokens: int | None = None,
              denominator: float | None = None) -> torch.Tensor:
    """A (B, L) per-token matrix to a scalar, as verl's ``agg_loss``:

    * ``token-mean``: sum over every kept token / number of kept tokens (DAPO; long and short completions weigh
      per token).
    * ``seq-mean-token-mean``: each sequence's token mean, averaged over sequences (original GRPO).
    * ``seq-mean-token-sum-norm``: each sequence's token sum / ``max_new_tokens``, averaged over sequences
      (Dr. GRPO; TRL's ``dr_grpo`` divides by batch x max_completion_length; verl's variant omits the batch
      size, a constant factor).

    ``denominator`` replaces the local count (tokens for token-mean, sequences otherwise) with the whole step's
    count across micro-batches and ranks, so that micro-batching and sharding do not change the gradient.
    Rows whose mask is all zero (padding rows) count for nothing."""
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        num = _seq_sums(values, mask).sum()
        den = mask.sum() if denominator is None else denominator
    else:
        lengths = mask.sum(-1)
        if mode == "seq-mean-token-mean":
            per_seq = _seq_sums(values, mask) / lengths.clamp(min=1)
        elif mode == "seq-mean-token-sum-norm":
            if not max_new_tokens:
                raise ValueError("seq-mean-token-sum-norm needs max_new_tokens (the constant normaliser)")
            per_seq = _seq_sums(values, mask) / max_new_tokens
        else:
            raise ValueError(f"unknown loss aggregation {mode!r}")
        num = per_seq.sum()
        den = (lengths > 0).sum() if denominator is None else denominator
    den_t = torch.as_tensor(den, dtype=values.dtype, device=values.device)
    return num / den_t.clamp(min=1)


def step_denominator(mode: LossAgg, lengths: Sequence[int]) -> float:
    """The denominator ``aggregate`` uses for a whole step, from the step's per-sequence loss-token counts."""
    kept = [n for n in lengths if n > 0]
    return float(sum(kept)) if mode == "token-mean" else float(len(kept))


@dataclass
class MicroBatch:
    """Right-padded prompt + completion rows. Matrices (B, L) are aligned with ``sequence_logprobs(..., start)``:
    column j scores the token at position ``start + 1 + j``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    start: int
    mask: torch.Tensor  # 1.0 on completion tokens that get a loss
    old_logp: torch.Tensor
    advantages: torch.Tensor  # (B,)

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(self.input_ids.to(device), self.attention_mask.to(device), self.start,
                          self.mask.to(device), self.old_logp.to(device), self.advantages.to(device))


def collate(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
            old_logprobs: Sequence[Sequence[float]], advantages: Sequence[float], pad_id: int,
            trained: Sequence[bool] | None = None,
            loss_masks: Sequence[Sequence[int]] | None = None) -> MicroBatch:
    """Rows of ``prompt + completion`` padded right; the loss mask covers the completion tokens of trained rows
    whose ``loss_masks`` value is 1 (the tokens the policy sampled; None: every completion token), so the
    environment's observations in a multi-turn episode are context but get no loss. A row with ``trained``
    False, a padding row that keeps every rank's collectives in step, gets none."""
    if not prompts:
        raise ValueError("an empty micro-batch")
    trained = [True] * len(prompts) if trained is None else list(trained)
    masks = [[1] * len(c) for c in completions] if loss_masks is None else [list(m) for m in loss_masks]
    for p, c, lp, lm in zip(prompts, completions, old_logprobs, masks, strict=True):
        if not p:
            raise ValueError("a row without prompt tokens: its first completion token has no position to score")
        if len(c) != len(lp):
            raise ValueError(f"completion has {len(c)} tokens but {len(lp)} log-probs")
        if len(c) != len(lm):
            raise ValueError(f"completion has {len(c)} tokens but {len(lm)} loss-mask values")
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
    t = max(lengths)
    start = min(len(p) for p in prompts) - 1
    b, width = len(prompts), t - 1 - start
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    attn = torch.zeros((b, t), dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.float32)
    old = torch.zeros((b, width), dtype=torch.float32)
    for i, (p, c, lp) in enumerate(zip(prompts, completions, old_logprobs, strict=True)):
        ids[i, :lengths[i]] = torch.tensor([*p, *c], dtype=torch.long)
        attn[i, :lengths[i]] = 1
        first = len(p) - 1 - start  # the column scoring the first completion token
        old[i, first:first + len(c)] = torch.tensor(lp, dtype=torch.float32)
        if trained[i]:
            mask[i, first:first + len(c)] = torch.tensor(masks[i], dtype=torch.float32)
    return MicroBatch(ids, attn, start, mask, old, torch.tensor(list(advantages), dtype=torch.float32))


# Token-level sums of one micro-batch, in this order; all-reduced (SUM) across ranks and added over micro-steps.
SUM_KEYS = ("tokens", "ratio", "clipped_low", "clipped_high", "kl_old", "kl_ref", "entropy")


def token_sums(terms: TokenTerms, mask: torch.Tensor) -> torch.Tensor:
    """The masked sums ``SUM_KEYS`` (a float64 vector, detached); metrics are these over ``tokens``."""
    m = mask.to(torch.float64)

    def s(x: torch.Tensor | None) -> torch.Tensor:
        return torch.zeros((), dtype=torch.float64, device=mask.device) if x is None else \
            (x.detach().to(torch.float64) * m).sum()

    return torch.stack([m.sum(), s(terms.ratio), s(terms.clipped_low), s(terms.clipped_high), s(terms.kl_old),
                        s(terms.kl_ref), s(terms.entropy)])


def ratio_extremes(terms: TokenTerms, mask: torch.Tensor) -> tuple[float, float]:
    """Min and max ratio over the masked tokens (1.0 when there are none)."""
    sel = terms.ratio.detach()[mask > 0]
    return (float(sel.min()), float(sel.max())) if sel.numel() else (1.0, 1.0)


def metrics_from_sums(sums: Sequence[float]) -> dict[str, float]:
    """Token means of the summed terms: clip fractions (low/high), ratio mean, KLs and entropy."""
    d = dict(zip(SUM_KEYS, (float(x) for x in sums), strict=True))
    n = max(d["tokens"], 1.0)
    return {"tokens": d["tokens"], "ratio_mean": d["ratio"] / n if d["tokens"] else 1.0,
            "clip_frac_low": d["clipped_low"] / n, "clip_frac_high": d["clipped_high"] / n,
            "kl_old": d["kl_old"] / n, "kl_ref": d["kl_ref"] / n, "entropy": d["entropy"] / n}


def dealt(count: int, rank: int, world: int, micro_batch: int) -> list[range]:
    """The positions among a step's ``count`` samples that ``rank`` trains, cut into micro-batches: samples are
    dealt to the ranks in turn (a short step still spreads over every rank), and every rank gets the same number
    of micro-batches (some may be empty)."""
    mine = range(rank, count, world)
    micros = math.ceil(math.ceil(count / world) / micro_batch)
    return [mine[m * micro_batch:(m + 1) * micro_batch] for m in range(micros)]


def summarize(history: Sequence[dict[str, Any]], selection: dict[str, float]) -> dict[str, float]:
    """The done line's metrics from the per-step records: token-weighted means for the token metrics, the mean
    over steps for losses and grad norms, extremes for the ratio."""
    out: dict[str, float] = {**selection, "steps": len(history)}
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
class Sample:
    """One episode as GRPO trains on it: its tokens, the sampler's log-probs, its group advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]  # every token after the prompt: sampled (loss_mask 1) and observed (0)
    logprobs: list[float]
    advantage: float
    loss_mask: list[int]

    @property
    def loss_tokens(self) -> int:
        return sum(self.loss_mask)


class StepSamples(Protocol):
    """Where an update's samples come from, one optimizer step's worth at a time: an iteration's rollouts table
    (``rl.update.RolloutSamples``), or, for asynchronous RL, a queue of scored groups."""

    @property
    def stats(self) -> dict[str, float]:
        """What selecting the samples counted (the summary's selection metrics; docs/rl.md)."""
        ...

    @property
    def max_new_tokens(self) -> int:
        """Dr. GRPO's constant length normaliser."""
        ...

    @property
    def top_token(self) -> int:
        """The largest token id the samples hold (checked against the policy's vocabulary before training)."""
        ...

    def open(self, per_step: int) -> int | None:
        """Read the samples for steps of ``per_step`` samples (every rank); the step count, None if open-ended."""
        ...

    def fingerprint(self, world: int) -> str:
        """What a checkpoint of this update must match: the samples, the config and the world size."""
        ...

    def step(self, step: int) -> Sequence[Sample] | None:
        """Every sample of step ``step`` (all ranks'), in order; None: no more steps."""
        ...


class PolicyStore(Protocol):
    """Where an update's policy comes from and goes (``rl.update.PolicyFolders``)."""

    @property
    def from_memory(self) -> bool:
        """The starting policy is held in memory (a long-lived worker's), not read from disk."""
        ...

    def load(self, d: Dist) -> torch.nn.Module:
        """The starting policy on ``d.device``."""
        ...

    def carry_over(self, core: TrainingCore) -> None:
        """The previous update's optimizer state (and weights, when held in memory) into the attached model."""
        ...

    def export(self, core: TrainingCore, summary: dict[str, Any]) -> None:
        """The updated policy and its optimizer state, with ``summary`` (a collective; rank 0 writes)."""
        ...

    def unchanged(self, summary: dict[str, Any]) -> None:
        """Rank 0, when nothing trained: the starting policy exported as it is, with ``summary``."""
        ...


class GRPOObjective:
    """GRPO's objective on the one training loop: each step's samples pulled from ``samples`` (all ranks see the
    whole step: the loss is normalised by its count across micro-batches and ranks, so micro-batching and
    sharding do not change the gradient), dealt to the ranks, padded into micro-batches; the clipped loss with
    the optional KL to a frozen reference and entropy bonus; one record per step (docs/rl.md for the metrics)."""

    loss_metric: ClassVar[str] = "loss"
    tracked = None  # the policy stage records the update's summary

    def __init__(self, cfg: GRPOConfig, samples: StepSamples, policy: PolicyStore, ckpt_dir: str,
                 reference_dir: str | None = None) -> None:
        self.cfg, self.samples, self.policy, self.reference_dir = cfg, samples, policy, reference_dir
        self.settings = LoopSettings(cfg.device, cfg.parallelism, cfg.dtype, cfg.grad_clip, ckpt_dir,
                                     cfg.keep_checkpoints, cfg.checkpoint_every)
        self.started = time.perf_counter()
        self.history: list[dict[str, Any]] = []
        self.start_step = 0
        self.ref: torch.nn.Module | None = None

    def open(self, d: Dist) -> RunPlan:
        cfg = self.cfg
        self.d = d
        self.total = self.samples.open(d.world * cfg.micro_batch_size * cfg.grad_accum)
        return RunPlan(self.total, Optimization(  # constant lr after the warmup
            cfg.lr, cfg.beta1, cfg.beta2, cfg.weight_decay, "wsd", cfg.warmup_steps, self.total or 0,
            min_lr_ratio=1.0), self.samples.fingerprint(d.world), "other rollouts, config or world size")

    def build_model(self, d: Dist) -> torch.nn.Module:
        model: Any = self.policy.load(d)
        vocab = model.get_input_embeddings().num_embeddings
        if self.samples.top_token >= vocab:
            raise ValueError(f"the rollouts hold token id {self.samples.top_token} but the policy's vocabulary has "
                             f"{vocab} entries: rollouts and policy_dir do not belong together")
        pad = model.config.pad_token_id if model.config.pad_token_id is not None else model.config.eos_token_id
        self.pad_id = int(pad[0] if isinstance(pad, list) else pad or 0)
        return model

    def attached(self, core: TrainingCore) -> None:
        """The frozen reference (sharded like the policy under FSDP), then the previous update's state."""
        from codemill.models.build import load_pretrained  # transformers: only where a model is loaded

        cfg = self.cfg
        if self.reference_dir is not None:
            ref = load_pretrained(self.reference_dir, seed=cfg.seed).to(self.d.device).eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            self.ref = (parallel.wrap(ref, "fsdp", self.d, bf16=cfg.dtype == "bfloat16")
                        if cfg.parallelism == "fsdp" else ref)
        self.policy.carry_over(core)

    def restore(self, saved: dict[str, Any]) -> None:
        self.history = list(saved["history"])

    def begin(self, start_step: int) -> dict[str, Any]:
        self.start_step = start_step
        return {"steps": self.total, "from_memory": self.policy.from_memory, **self.samples.stats}

    def next_step(self, step: int) -> MicroBatches[MicroBatch] | None:
        """This rank's micro-batches of the step; the step's denominator and metric sums start here."""
        samples = self.samples.step(step)
        if samples is None:
            return None
        self.step_samples = len(samples)
        self.den = step_denominator(self.cfg.loss_agg, [s.loss_tokens for s in samples])
        self.sums = torch.zeros(len(SUM_KEYS) + 2, dtype=torch.float64)  # + the loss and the policy loss
        self.lo, self.hi = math.inf, -math.inf
        micros = [[samples[i] for i in rows]
                  for rows in dealt(len(samples), self.d.rank, self.d.world, self.cfg.micro_batch_size)]
        return MicroBatches(len(micros), lambda m: self.micro_batch(micros[m]).to(self.d.device))

    def micro_batch(self, samples: Sequence[Sample]) -> MicroBatch:
        """This rank's samples, padded right; a rank with none this micro-step gets one masked dummy row, so every
        rank runs the same forwards and backwards (the collectives stay in step)."""
        if not samples:
            return collate([[self.pad_id]], [[self.pad_id]], [[0.0]], [0.0], self.pad_id, trained=[False])
        return collate([s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                       [s.logprobs for s in samples], [s.advantage for s in samples], self.pad_id,
                       loss_masks=[s.loss_mask for s in samples])

    def loss(self, module: torch.nn.Module, batch: MicroBatch) -> tuple[torch.Tensor, Any]:
        """The aggregated loss times the world size: DDP / FSDP average gradients over ranks, and the
        denominator already is the whole step's."""
        cfg = self.cfg
        logp, entropy = sequence_logprobs(module, batch.input_ids, batch.attention_mask, cfg.temperature,
                                          batch.start, with_entropy=True, entropy_grad=cfg.entropy_coef > 0)
        ref_logp = None
        if self.ref is not None:
            with torch.no_grad():
                ref_logp, _ = sequence_logprobs(self.ref, batch.input_ids, batch.attention_mask, cfg.temperature,
                                                batch.start)
        terms = token_terms(logp, batch.old_logp, batch.advantages, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                            kl_coef=cfg.kl_coef, ref_logp=ref_logp, entropy=entropy, entropy_coef=cfg.entropy_coef)
        loss = aggregate(terms.loss, batch.mask, cfg.loss_agg, max_new_tokens=self.samples.max_new_tokens,
                         denominator=self.den)
        return loss * self.d.world, (batch, terms, loss)

    def account(self, seen: Any) -> None:
        batch, terms, loss = seen
        pg = aggregate(terms.pg_loss.detach(), batch.mask, self.cfg.loss_agg,
                       max_new_tokens=self.samples.max_new_tokens, denominator=self.den)
        self.sums += torch.cat([token_sums(terms, batch.mask).cpu(),
                                torch.tensor([float(loss.detach()), float(pg)], dtype=torch.float64)])
        r_lo, r_hi = ratio_extremes(terms, batch.mask)
        if batch.mask.sum() > 0:
            self.lo, self.hi = min(self.lo, r_lo), max(self.hi, r_hi)

    def end_step(self, step: int, grad_norm: float, lr: float) -> dict[str, Any]:
        """The step's record: its metrics reduced over ranks."""
        sums, extremes = self.sums, torch.tensor([-self.lo, self.hi], dtype=torch.float64)
        if self.d.distributed:  # on the process group's device (nccl reduces CUDA tensors only)
            sums, extremes = sums.to(self.d.device), extremes.to(self.d.device)
            dist.all_reduce(sums)
            dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
            sums, extremes = sums.cpu(), extremes.cpu()
        tok = metrics_from_sums(sums[:len(SUM_KEYS)].tolist())
        kl = tok["kl_ref"] if self.ref is not None else tok["kl_old"]
        record = {"step": step + 1, "max_steps": self.total, "loss": float(sums[-2]), "pg_loss": float(sums[-1]),
                  "kl": kl, **tok, "ratio_min": float(-extremes[0]), "ratio_max": float(extremes[1]),
                  "grad_norm": grad_norm, "lr": lr, "samples": self.step_samples}
        self.history.append(record)
        return record

    def logged(self, record: dict[str, Any]) -> dict[str, float]:
        return {k: v for k, v in record.items() if k not in ("step", "max_steps")}

    def evaluate(self, step: int) -> dict[str, float]:
        return {}

    @property
    def best_step(self) -> int | None:
        return None

    def checkpoint_state(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def finish(self, core: TrainingCore | None) -> Finished:
        """The updated policy exported with the summary; with no steps, the starting policy, and why."""
        if core is None:
            metrics = summarize([], self.samples.stats) | {"update_s": time.perf_counter() - self.started,
                                                           "resumed_from": 0, "tokens_per_s": 0.0}
            reason = skip_reason(self.samples.stats, self.cfg)
            if self.d.rank == 0:
                self.policy.unchanged({"metrics": metrics, "skipped": reason, "history": []})
            return Finished({"metrics": metrics, "skipped": reason, "history": []},
                            {"metrics": metrics, "skipped": reason})
        metrics = summarize(self.history, self.samples.stats)
        update_s = time.perf_counter() - self.started
        ran = self.history[self.start_step:]
        metrics |= {"update_s": update_s, "resumed_from": self.start_step,
                    "tokens_per_s": sum(h["tokens"] for h in ran) / update_s}
        summary = {"metrics": metrics, "history": self.history}
        self.policy.export(core, summary)
        return Finished(summary, {"metrics": metrics})


def skip_reason(stats: dict[str, float], cfg: GRPOConfig) -> str:
    """Why no sample survived the selection."""
    if not stats["samples"]:
        return "the rollouts table is empty"
    if cfg.dynamic_sampling and stats["groups_dropped"] == stats["groups"]:
        return "no group with distinct rewards survived dynamic sampling"
    return "no sample left to train on after overlong masking"


OPTIMIZER = "optimizer"  # a GRPO policy artifact's AdamW state, which the next iteration's update continues
SUMMARY = "update_summary.json"  # beside the updated policy: the update's metrics and step records


class RLUpdateSpec(BaseModel):
    """What the rl flow's update task hands the GRPO update job (``codemill.rl.update``; written to SPEC.json)."""

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


class GRPO:
    """GRPO and its variants (``rl.algorithm: {name: grpo, ...}``): the loss above, run by ``codemill.rl.update``
    under torchrun on the iteration's rollouts, AdamW continued from the previous update's state."""

    name: ClassVar[str] = "grpo"
    settings: ClassVar[type[AlgorithmSettings]] = GRPOConfig

    def update_config(self, rl: RLConfig, train: TrainConfig, iteration: int, seed: int) -> dict[str, Any]:
        assert isinstance(rl.algorithm, GRPOConfig)
        return {"algorithm": self.name, "grpo": rl.algorithm.model_copy(update={"seed": seed}).digest_config(),
                "max_new_tokens": rl.rollout.max_new_tokens * rl.env.max_turns, "iteration": iteration}

    def launch_config(self, rl: RLConfig, train: TrainConfig) -> GRPOConfig:
        assert isinstance(rl.algorithm, GRPOConfig)
        return rl.algorithm

    def job(self, inputs: UpdateInputs) -> UpdateJob:
        import json

        grpo = self.launch_config(inputs.rl, inputs.train).model_copy(update={"seed": inputs.config["grpo"]["seed"]})
        previous = inputs.previous / OPTIMIZER if inputs.previous is not None else None
        spec = RLUpdateSpec(grpo=grpo, policy_dir=inputs.policy_hf,
                            reference_dir=inputs.reference_hf if grpo.kl_coef > 0 else None,
                            rollouts_path=str(inputs.rollouts_path), out_dir=str(inputs.out_dir / "hf"),
                            ckpt_dir=str(inputs.scratch / "checkpoints"),
                            max_new_tokens=inputs.config["max_new_tokens"],
                            optimizer_in=str(previous) if previous is not None and previous.is_dir() else None,
                            optimizer_out=str(inputs.out_dir / OPTIMIZER))

        def result() -> dict[str, Any]:
            summary = json.loads((inputs.out_dir / "hf" / SUMMARY).read_text())
            return {"algorithm": self.name, "update": summary.get("metrics", summary)}

        return UpdateJob(spec, grpo, "codemill.rl.update", result, served=grpo.workers == "run")


ALGORITHM = GRPO()
