"""GRPO's pure pieces on small hand-computed tensors (codemill/rl/algorithms/grpo.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from codemill.models.config import ModelConfig
from codemill.rl.algorithms.grpo import (
    aggregate,
    collate,
    dynamic_sampling_keep,
    entropy_from_logits,
    group_advantages,
    kl_k3,
    metrics_from_sums,
    overlong_keep,
    sequence_logprobs,
    step_denominator,
    token_sums,
    token_terms,
    zero_variance_groups,
)

REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.2, 0.6]
GROUPS = [0, 0, 0, 0, 1, 1, 2, 3, 3]  # 0: mixed, 1: all pass, 2: a lone sample, 3: partial rewards


def test_group_advantages_normalised_by_the_unbiased_std():
    adv = group_advantages(REWARDS, GROUPS)
    z = 0.5 / math.sqrt(1 / 3)  # group 0: mean 0.5, unbiased var 4 * 0.25 / 3
    assert adv[:4] == pytest.approx([z, -z, -z, z], rel=1e-5)
    assert adv[4:7].tolist() == [0.0, 0.0, 0.0]  # zero variance and a group of one: exactly 0
    assert adv[7:] == pytest.approx([-0.2 / math.sqrt(0.08), 0.2 / math.sqrt(0.08)], rel=1e-5)
    assert sum(adv[:4]) == pytest.approx(0.0, abs=1e-12)


def test_dr_grpo_advantages_are_only_centred():
    adv = group_advantages(REWARDS, GROUPS, norm_by_std=False)
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, -0.2, 0.2])


def test_advantages_do_not_depend_on_row_order_or_label_type():
    perm = np.random.default_rng(0).permutation(len(REWARDS))
    labels = [f"p{g}" for g in GROUPS]
    shuffled = group_advantages(np.asarray(REWARDS)[perm], np.asarray(labels)[perm])
    assert shuffled == pytest.approx(group_advantages(REWARDS, GROUPS)[perm])


def test_constant_non_round_rewards_give_exact_zero():
    """A mean of equal floats may be off by an ulp; the group is zero-variance, so its advantages are exactly 0."""
    adv = group_advantages([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], [0, 0, 0, 1, 1, 1])
    assert adv.tolist() == [0.0] * 6


def test_dynamic_sampling_keeps_groups_with_distinct_rewards():
    keep = dynamic_sampling_keep(REWARDS, GROUPS)
    assert keep.tolist() == [True] * 4 + [False] * 3 + [True] * 2
    assert (zero_variance_groups(REWARDS, GROUPS) == ~keep).all()


def test_overlong_mask_drops_truncated_completions_only():
    assert overlong_keep(["stop", "length", "eos", "length"]).tolist() == [True, False, True, False]


def _terms(ratio: list[float], adv: list[float], clip_high: float = 0.28):
    old = torch.zeros(1, len(ratio))
    logp = torch.log(torch.tensor([ratio])).requires_grad_(True)
    return logp, token_terms(logp, old, torch.tensor([adv]), clip_low=0.2, clip_high=clip_high)


def test_clipped_loss_by_hand():
    ratio = [1.5, 0.5, 1.1, 0.5, 1.5]
    adv = [1.0, -1.0, 2.0, 1.0, -1.0]
    _, t = _terms(ratio, adv)
    # max(-A r, -A clamp(r, 0.8, 1.28)): clipped above (A>0), clipped below (A<0), inside, and the two
    # pessimistic cases where the unclipped term is the larger loss
    assert t.pg_loss[0].tolist() == pytest.approx([-1.28, 0.8, -2.2, -0.5, 1.5], rel=1e-6)
    assert t.ratio[0].tolist() == pytest.approx(ratio, rel=1e-6)
    assert t.clipped_high[0].tolist() == [True, False, False, False, False]
    assert t.clipped_low[0].tolist() == [False, True, False, False, False]
    sums = token_sums(t, torch.ones(1, 5))
    m = metrics_from_sums(sums.tolist())
    assert m["clip_frac_high"] == pytest.approx(0.2) and m["clip_frac_low"] == pytest.approx(0.2)
    assert m["ratio_mean"] == pytest.approx(sum(ratio) / 5) and m["tokens"] == 5


def test_clip_higher_lets_a_rising_positive_token_keep_its_gradient():
    """DAPO: at ratio 1.25 with A > 0, the symmetric 0.2 clip stops the gradient; clip_high 0.28 does not."""
    for clip_high, expected in [(0.2, 0.0), (0.28, -1.25)]:
        logp, t = _terms([1.25], [1.0], clip_high=clip_high)
        t.pg_loss.sum().backward()
        assert logp.grad is not None
        assert logp.grad.item() == pytest.approx(expected, abs=1e-6), clip_high
    logp, t = _terms([0.75], [-1.0])  # the low clip is unchanged: A < 0 below 1 - clip_low has no gradient
    t.pg_loss.sum().backward()
    assert logp.grad is not None and logp.grad.item() == 0.0


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2: a padding row


def test_aggregation_modes_by_hand():
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", max_new_tokens=4).item() == pytest.approx(
        (6 / 4 + 4 / 4) / 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_step_denominator_makes_micro_batches_add_up(mode):
    """Splitting a step into micro-batches (or ranks) with the step's denominator gives the whole-step loss."""
    den = step_denominator(mode, [int(n) for n in MASK.sum(-1)])
    parts = sum(aggregate(LOSS[i:i + 1], MASK[i:i + 1], mode, max_new_tokens=4, denominator=den) for i in range(3))
    assert float(parts) == pytest.approx(aggregate(LOSS, MASK, mode, max_new_tokens=4).item())


def test_kl_k3_zero_for_identical_policies_and_unbiased():
    logp = torch.log_softmax(torch.randn(4, 7), -1)
    assert (kl_k3(logp, logp) == 0).all()
    p = torch.softmax(torch.tensor([2.0, 0.5, -1.0, 0.0]), -1)
    q = torch.softmax(torch.tensor([0.0, 1.0, 0.0, -0.5]), -1)
    tokens = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    estimate = kl_k3(p.log()[tokens], q.log()[tokens]).mean().item()
    exact = float((p * (p.log() - q.log())).sum())
    assert estimate == pytest.approx(exact, rel=0.02)
    assert (kl_k3(p.log()[tokens], q.log()[tokens]) >= 0).all()


def test_entropy_from_logits():
    assert entropy_from_logits(torch.zeros(2, 5)).tolist() == pytest.approx([math.log(5)] * 2)
    assert entropy_from_logits(torch.tensor([[0.0, -1e4]])).item() == pytest.approx(0.0, abs=1e-6)


def _tiny_model(seed: int = 0):
    from codemill.models.build import build_model

    cfg = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    return build_model(cfg, vocab_size=40, max_len=64, eos_id=0, pad_id=1, seed=seed).eval()


PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
COMPLETIONS = [[20, 21], [22, 23, 24, 25], [26]]


def test_collate_aligns_completion_logprobs_with_the_contract_convention():
    """Each completion token's log-prob in a right-padded batch is log_softmax(logits / T) at the position before
    it, computed on the row alone (the sampler's convention); the mask covers exactly the completion tokens."""
    model, temp = _tiny_model(), 0.7
    batch = collate(PROMPTS, COMPLETIONS, [[0.0] * len(c) for c in COMPLETIONS], [1.0, -1.0, 0.5], pad_id=1)
    with torch.no_grad():
        logp, ent = sequence_logprobs(model, batch.input_ids, batch.attention_mask, temp, batch.start,
                                      with_entropy=True)
    assert logp.shape == batch.mask.shape and ent is not None and ent.shape == logp.shape
    for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS, strict=True)):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + c])).logits[0].float()
        expected = [torch.log_softmax(logits[len(p) - 1 + j] / temp, -1)[tok].item() for j, tok in enumerate(c)]
        got = logp[i][batch.mask[i] > 0].tolist()
        assert got == pytest.approx(expected, abs=1e-5), i
    assert batch.mask.sum(-1).tolist() == [2.0, 4.0, 1.0]


def test_collate_padding_rows_get_no_loss():
    batch = collate([[3], [4, 5]], [[6, 7], [8]], [[-1.0, -2.0], [-3.0]], [1.0, 1.0], pad_id=1,
                    trained=[True, False])
    assert batch.mask.sum().item() == 2.0 and batch.mask[1].sum().item() == 0.0
    assert batch.old_logp[0][batch.mask[0] > 0].tolist() == [-1.0, -2.0]
    with pytest.raises(ValueError, match="log-probs"):
        collate([[3]], [[6, 7]], [[-1.0]], [1.0], pad_id=1)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_ratio_is_one_at_the_start_so_the_gradient_is_the_policy_gradient(mode):
    """With old log-probs from the same weights (the contract's convention), ratio == 1 and the clipped loss's
    gradient equals REINFORCE's, -A * grad log pi, aggregated the same way."""
    model, temp = _tiny_model(seed=3), 1.0
    adv = [1.0, -0.5, 2.0]
    with torch.no_grad():
        probe = collate(PROMPTS, COMPLETIONS, [[0.0] * len(c) for c in COMPLETIONS], adv, pad_id=1)
        old, _ = sequence_logprobs(model, probe.input_ids, probe.attention_mask, temp, probe.start)
    olds = [old[i][probe.mask[i] > 0].tolist() for i in range(3)]
    batch = collate(PROMPTS, COMPLETIONS, olds, adv, pad_id=1)

    def grads(loss_fn) -> list[torch.Tensor]:
        model.zero_grad()
        logp, _ = sequence_logprobs(model, batch.input_ids, batch.attention_mask, temp, batch.start)
        loss_fn(logp).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    def clipped(logp):
        t = token_terms(logp, batch.old_logp, batch.advantages, clip_low=0.2, clip_high=0.28)
        assert (t.ratio[batch.mask > 0] == 1.0).all()
        return aggregate(t.loss, batch.mask, mode)

    def reinforce(logp):
        return aggregate(-batch.advantages[:, None] * logp, batch.mask, mode)

    a, b = grads(clipped), grads(reinforce)
    assert len(a) == len(b) > 0
    for ga, gb in zip(a, b, strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in a)


def test_kl_term_enters_the_loss_with_its_coefficient():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    off = token_terms(logp, logp, torch.tensor([0.0]), clip_low=0.2, clip_high=0.28, ref_logp=ref)
    on = token_terms(logp, logp, torch.tensor([0.0]), clip_low=0.2, clip_high=0.28, ref_logp=ref, kl_coef=0.1)
    k3 = 0.5 - math.log(0.5) - 1  # exp(ref - logp) - (ref - logp) - 1 with ref - logp = log 0.5
    assert off.kl_ref is not None and off.kl_ref[0].tolist() == pytest.approx([k3, 0.0], abs=1e-7)
    assert off.loss.abs().sum().item() == 0.0  # A = 0 and no KL weight
    assert on.loss[0].tolist() == pytest.approx([0.1 * k3, 0.0], abs=1e-7)


def test_entropy_bonus_enters_the_loss_only_with_its_coefficient():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    ent = torch.tensor([[1.0, 2.0]])
    kw = dict(clip_low=0.2, clip_high=0.28, entropy=ent)
    assert token_terms(logp, logp, torch.tensor([0.0]), **kw).loss.abs().sum().item() == 0.0
    on = token_terms(logp, logp, torch.tensor([0.0]), entropy_coef=0.01, **kw)
    assert on.loss[0].tolist() == pytest.approx([-0.01, -0.02])
