"""The GRPO update's data side without torchrun: which samples train, in what order, and the atomic export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from codemill.rl.algorithms.grpo import GRPOConfig
from codemill.rl.update import SUMMARY, RLUpdateSpec, SampleOrder, fingerprint, plan_update, write_policy


def _table(rewards: list[list[float]], truncated: set[tuple[int, int]] = frozenset()) -> dict[str, list]:
    t: dict[str, list] = {k: [] for k in ["group", "sample", "prompt_ids", "completion_ids", "loss_mask",
                                          "logprobs", "turn_starts", "turn_finish_reasons", "finish_reason",
                                          "reward"]}
    for g, rs in enumerate(rewards):
        for s, r in enumerate(rs):
            t["group"].append(g)
            t["sample"].append(s)
            t["prompt_ids"].append([1, 2])
            t["completion_ids"].append([3] * (s + 1))
            t["loss_mask"].append([1] * (s + 1))
            t["logprobs"].append([-1.0] * (s + 1))
            t["finish_reason"].append("length" if (g, s) in truncated else "stop")
            t["turn_starts"].append([0])
            t["turn_finish_reasons"].append([t["finish_reason"][-1]])
            t["reward"].append(r)
    return t


def test_plan_keeps_signal_groups_and_untruncated_samples():
    table = _table([[1, 0, 1], [1, 1, 1], [0, 0, 1]], truncated={(0, 2), (1, 0)})
    plan = plan_update(table, GRPOConfig())
    assert plan.stats == {"samples": 9, "samples_kept": 5, "samples_truncated": 2, "turns_truncated": 0,
                          "groups": 3, "groups_kept": 2,
                          "groups_zero_variance": 1, "groups_dropped": 1,
                          "adv_abs_mean": pytest.approx(np.mean([abs(s.advantage) for s in plan.samples]))}
    # the truncated sample of group 0 is still part of its group's baseline: the two kept ones are not +-equal
    assert [s.advantage for s in plan.samples[:2]] == pytest.approx([3 ** -0.5, -2 * 3 ** -0.5], rel=1e-5)
    assert plan.max_new_tokens == 3  # the longest completion when the rollout's max_new_tokens is not given
    assert plan_update(table, GRPOConfig(), max_new_tokens=64).max_new_tokens == 64


def test_plan_switches():
    table = _table([[1, 0, 1], [1, 1, 1]], truncated={(0, 2)})
    everything = plan_update(table, GRPOConfig(dynamic_sampling=False, overlong_mask=False))
    assert everything.stats["samples_kept"] == 6 and everything.stats["groups_dropped"] == 0
    assert everything.stats["groups_zero_variance"] == 1
    assert [s.advantage for s in everything.samples[3:]] == [0.0, 0.0, 0.0]


def test_plan_names_a_row_whose_logprobs_do_not_match():
    table = _table([[1, 0]])
    table["logprobs"][1] = [-1.0]
    with pytest.raises(ValueError, match="row 1 .*2 completion tokens but 1 log-probs"):
        plan_update(table, GRPOConfig())


def test_plan_counts_only_sampled_tokens_and_drops_episodes_cut_on_a_limit():
    """Observation tokens (mask 0) are context, not loss tokens; an episode cut on a limit trains like a truncated
    completion (not at all, by default), and one with no sampled token has nothing to train."""
    table = _table([[1, 0, 1, 0]])
    table["completion_ids"][1] = [3, 4, 4, 3]
    table["logprobs"][1] = [-1.0, 0.0, 0.0, -1.0]
    table["loss_mask"][1] = [1, 0, 0, 1]
    table["finish_reason"][2] = "max_tokens"
    table["loss_mask"][3] = [0, 0, 0, 0]
    plan = plan_update(table, GRPOConfig())
    assert [s.loss_tokens for s in plan.samples] == [1, 2]
    assert plan.stats["samples_truncated"] == 1
    assert plan.max_new_tokens == 3  # the most sampled tokens (row 2's, though cut), not the longest row


def test_a_turn_cut_before_the_episodes_last_gets_no_loss_under_overlong_masking():
    """Three turns of 2 sampled tokens with 1 feedback token after each of the first two; the middle turn was cut
    at max_new_tokens. Overlong masking takes that turn's tokens out of the loss and keeps the others; without
    it every sampled token trains. The tokens themselves stay: they are the later turns' context."""
    table = _table([[1, 0]])
    table["completion_ids"][0] = [3, 3, 9, 4, 4, 9, 5, 5]
    table["loss_mask"][0] = [1, 1, 0, 1, 1, 0, 1, 1]
    table["logprobs"][0] = [-1.0, -1.0, 0.0, -1.0, -1.0, 0.0, -1.0, -1.0]
    table["turn_starts"][0] = [0, 3, 6]
    table["turn_finish_reasons"][0] = ["stop", "length", "stop"]
    masked = plan_update(table, GRPOConfig())
    assert masked.samples[0].loss_mask == [1, 1, 0, 0, 0, 0, 1, 1]
    assert masked.samples[0].completion_ids == table["completion_ids"][0]
    assert masked.stats["turns_truncated"] == 1 and masked.stats["samples_truncated"] == 0
    trained = plan_update(table, GRPOConfig(overlong_mask=False))
    assert trained.samples[0].loss_mask == table["loss_mask"][0] and trained.stats["turns_truncated"] == 1
    table["turn_finish_reasons"][0] = ["length", "length", "stop"]
    assert plan_update(table, GRPOConfig()).samples[0].loss_mask == [0, 0, 0, 0, 0, 0, 1, 1]


def test_sample_order_covers_each_epoch_once_and_deals_every_rank():
    order = SampleOrder(11, seed=5, per_step=8, epochs=2)  # world 2 x micro 2 x accum 2
    assert order.total_steps == 4
    for epoch in range(2):
        seen = np.concatenate([order.step_rows(s) for s in (2 * epoch, 2 * epoch + 1)])
        assert sorted(seen.tolist()) == list(range(11))
    epochs = [np.concatenate([order.step_rows(s) for s in steps]).tolist() for steps in ((0, 1), (2, 3))]
    assert epochs[0] != epochs[1]  # a fresh permutation each epoch
    for step in range(4):
        per_rank = [order.micro_rows(step, r, 2, 2) for r in range(2)]
        assert len(per_rank[0]) == len(per_rank[1])  # the same forwards and backwards on every rank
        rows = np.concatenate([m for micros in per_rank for m in micros])
        assert sorted(rows.tolist()) == sorted(order.step_rows(step).tolist())
    short = [order.micro_rows(1, r, 2, 2) for r in range(2)]  # 3 samples: both ranks get some, one micro-step
    assert [len(m) for m in short] == [1, 1] and [len(m[0]) for m in short] == [2, 1]
    again = SampleOrder(11, seed=5, per_step=8, epochs=2)
    assert again.step_rows(3).tolist() == order.step_rows(3).tolist()


def test_fingerprint_follows_the_inputs_not_runtime_knobs(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"one")
    (tmp_path / "b.parquet").write_bytes(b"two")

    def spec(name: str, **grpo) -> RLUpdateSpec:
        return RLUpdateSpec(grpo=GRPOConfig(**grpo), policy_dir="p", rollouts_path=str(tmp_path / name),
                            out_dir="o", ckpt_dir="c")

    base = fingerprint(spec("a.parquet"), world=2)
    assert fingerprint(spec("a.parquet", checkpoint_every=7), world=2) == base
    assert fingerprint(spec("b.parquet"), world=2) != base
    assert fingerprint(spec("a.parquet", lr=1.0), world=2) != base
    assert fingerprint(spec("a.parquet"), world=4) != base


def test_write_policy_replaces_leftovers_and_commits_by_rename(tmp_path):
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "model.safetensors").write_bytes(b"weights")
    (policy / "tokenizer.json").write_text("{}")
    out = tmp_path / "out"
    stale = tmp_path / ".staging-out"
    stale.mkdir()
    (stale / "half-written").write_text("x")  # a killed run's staging
    write_policy(None, policy, out, {"metrics": {"steps": 0}})
    assert not stale.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(["model.safetensors", "tokenizer.json", SUMMARY])
    (policy / "tokenizer.json").write_text('{"v": 2}')
    write_policy(None, policy, out, {"metrics": {"steps": 1}})  # a rerun replaces the export whole
    assert json.loads((out / SUMMARY).read_text())["metrics"]["steps"] == 1
    assert (out / "tokenizer.json").read_text() == '{"v": 2}'
    assert not list(Path(tmp_path).glob(".staging-*"))


def test_a_kl_weight_without_a_reference_is_refused_up_front():
    with pytest.raises(ValueError, match="kl_coef > 0 needs a reference_dir"):
        RLUpdateSpec(grpo=GRPOConfig(kl_coef=0.1), policy_dir="p", rollouts_path="r", out_dir="o", ckpt_dir="c")
    RLUpdateSpec(grpo=GRPOConfig(kl_coef=0.1), policy_dir="p", reference_dir="p", rollouts_path="r", out_dir="o",
                 ckpt_dir="c")
