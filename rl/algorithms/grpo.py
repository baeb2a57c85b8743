"""GRPO's pieces as pure functions: advantages, sample selection, per-token log-probs, the clipped loss, KL,
entropy, loss aggregation and the step metrics. ``codemill.rl.update`` runs them under torchrun.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F

from codemill.models.config import TrainConfig
from codemill.rl.algorithms.base import UpdateInputs, UpdateJob
from codemill.rl.config import GRPOConfig, RLConfig
from codemill.rl.trajectory import TRUNCATED_REASONS

__all__ = ["GRPO", "SUM_KEYS", "GRPOConfig", "LossAgg", "MicroBatch", "TokenTerms", "aggregate", "collate",
           "dynamic_sampling_keep", "entropy_from_logits", "group_advantages", "kl_k3", "metrics_from_sums",
           "overlong_keep", "ratio_extremes", "sequence_logprobs", "step_denominator", "token_sums", "token_terms",
           "zero_variance_groups"]

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
STD_EPS = 1e-6  # verl's epsilon (TRL uses 1e-4); only groups with non-zero std are divided


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


OPTIMIZER = "optimizer"  # a GRPO policy artifact's AdamW state, which the next iteration's update continues


class GRPO:
    """GRPO and its variants (``rl.algorithm: {name: grpo, ...}``): the loss above, run by ``codemill.rl.update``
    under torchrun on the iteration's rollouts, AdamW continued from the previous update's state."""

    name: ClassVar[str] = "grpo"

    def update_config(self, rl: RLConfig, train: TrainConfig, iteration: int, seed: int) -> dict[str, Any]:
        assert isinstance(rl.algorithm, GRPOConfig)
        return {"algorithm": self.name, "grpo": rl.algorithm.model_copy(update={"seed": seed}).digest_config(),
                "max_new_tokens": rl.rollout.max_new_tokens * rl.env.max_turns, "iteration": iteration}

    def launch_config(self, rl: RLConfig, train: TrainConfig) -> GRPOConfig:
        assert isinstance(rl.algorithm, GRPOConfig)
        return rl.algorithm

    def job(self, inputs: UpdateInputs) -> UpdateJob:
        import json

        from codemill.rl.update import SUMMARY, RLUpdateSpec

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
