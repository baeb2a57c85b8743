"""The multi-turn ``code_feedback`` environment in the real sandbox with a real engine: 4-turn episodes whose
trained tokens are exactly the sampled ones, feedback tokens under loss mask 0 that move neither the loss nor
any gradient, visible cases only in the feedback, and the final reward from the full tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from codemill.models.engines import Completion, HFEngine, RolloutParams
from codemill.problems.synthetic import synthetic_problems
from codemill.rl.algorithms.grpo import GRPOConfig, aggregate, collate, sequence_logprobs, token_terms
from codemill.rl.envs import env_for
from codemill.rl.envs.code_feedback import CodeFeedbackConfig, feedback_text, visible_cases
from codemill.rl.rollout import collect_rollouts
from codemill.rl.trajectory import read_rollouts, write_rollouts
from codemill.rl.update import plan_update
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool

pytestmark = [pytest.mark.usefixtures("one_torch_thread")]

PROBLEMS = synthetic_problems(11, 3)
LIMITS = Limits(wall_s=3.0, cpu_s=2, memory_bytes=256 << 20)
PARAMS = RolloutParams(temperature=1.0, max_new_tokens=12, stop=("\ndef",))


class RecordingEngine:
    """The real engine, with every completion it returned kept (what the trajectories must hold, token for token)."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine
        self.tokenizer, self.max_context = engine.tokenizer, engine.max_context
        self.sampled: list[Completion] = []

    def generate_ids(self, contexts: Sequence[Sequence[int]], k: int, params: RolloutParams,
                     seeds: Sequence[int]) -> list[list[Completion]]:
        out = self.engine.generate_ids(contexts, k, params, seeds)
        for context, group in zip(contexts, out, strict=True):
            for c in group:
                assert c.prompt_ids == list(context)  # token in: the engine saw the context as given
                self.sampled.append(c)
        return out

    def generate(self, prompts: Sequence[str], k: int, params: RolloutParams,
                 seeds: Sequence[int]) -> list[list[Completion]]:
        raise AssertionError("the rollout loop samples token in, token out")

    def load_weights(self, hf_dir: Any) -> None:
        self.engine.load_weights(hf_dir)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """Room for four turns and three feedbacks in the context."""
    from tests.tiny_policy import make_policy

    return make_policy(tmp_path_factory.mktemp("policy"), max_len=1024)


@pytest.fixture(scope="module")
def episodes(policy, tmp_path_factory) -> tuple[list[dict[str, Any]], RecordingEngine]:
    engine = RecordingEngine(HFEngine(policy))
    cfg = CodeFeedbackConfig(max_turns=4, visible_cases=2)
    with JudgePool(LIMITS, workers=1) as pool:
        env = env_for(cfg, engine, pool, PARAMS.max_new_tokens)
        rows, timings = collect_rollouts(engine, env, PROBLEMS, 2, PARAMS, seed=5, batch_problems=2)
    path = write_rollouts(rows, tmp_path_factory.mktemp("rollouts"))
    assert read_rollouts(path).to_pylist() == rows  # the schema holds multi-turn rows as they are
    assert timings.samples == 6
    return rows, engine


def test_episodes_do_not_depend_on_how_many_batches_generate_at_once(episodes, policy):
    """Two generation threads, each batch's turns on whichever is free: the same rows token for token."""
    rows, _ = episodes
    engine = HFEngine(policy)
    with JudgePool(LIMITS, workers=1) as pool:
        env = env_for(CodeFeedbackConfig(max_turns=4, visible_cases=2), engine, pool, PARAMS.max_new_tokens)
        threaded, timings = collect_rollouts(engine, env, PROBLEMS, 2, PARAMS, seed=5, batch_problems=2,
                                             generators=2)
    assert timings.samples == 6 and timings.batches == 2
    assert [{k: v for k, v in r.items() if k != "duration_s"} for r in threaded] == \
        [{k: v for k, v in r.items() if k != "duration_s"} for r in rows]


def test_four_turn_episodes_train_on_exactly_the_sampled_tokens(episodes):
    rows, engine = episodes
    assert [r["turns"] for r in rows] == [4] * 6  # an untrained policy fails every visible test: all 4 turns
    cut_early = 0
    by_context = {(tuple(c.prompt_ids), tuple(c.completion_ids)): c for c in engine.sampled}
    for r in rows:
        ids, mask, lps, starts = r["completion_ids"], r["loss_mask"], r["logprobs"], r["turn_starts"]
        ends = [*starts[1:], len(ids)]
        turns = []
        for t, (s, e) in enumerate(zip(starts, ends, strict=True)):
            sampled_end = s + next((n for n, m in enumerate(mask[s:e]) if m == 0), e - s)
            c = by_context[(tuple(r["prompt_ids"] + ids[:s]), tuple(ids[s:sampled_end]))]  # as the engine returned it
            turns.append(c)
            assert lps[s:sampled_end] == c.logprobs  # bit-identical (float32 in the table, as sampled)
            assert mask[sampled_end:e] == [0] * (e - sampled_end)
            if t < 3:  # the feedback after every turn but the last: visible failures and the prompt again
                observed = engine.tokenizer.decode(ids[sampled_end:e])
                assert observed.startswith("\n# Tests: ") and observed.endswith(r["prompt"])
        assert r["completion"] == turns[-1].text  # the graded solution is the last turn's
        assert r["turn_finish_reasons"] == [c.finish_reason for c in turns]
        # what the update trains on: the columns under its loss mask hold exactly the sampled tokens, in order
        table = {k: [r[k]] for k in ("group", "sample", "prompt_ids", "completion_ids", "loss_mask", "logprobs",
                                     "turn_starts", "turn_finish_reasons", "finish_reason")}
        table["reward"] = [0.0]
        (sample,) = plan_update(table, GRPOConfig(dynamic_sampling=False, overlong_mask=False)).samples
        batch = collate([sample.prompt_ids], [sample.completion_ids], [sample.logprobs], [1.0], pad_id=0,
                        loss_masks=[sample.loss_mask])
        targets = batch.input_ids[0, batch.start + 1:]
        assert targets[batch.mask[0] > 0].tolist() == [tok for c in turns for tok in c.completion_ids]
        assert batch.old_logp[0][batch.mask[0] > 0].tolist() == [lp for c in turns for lp in c.logprobs]
        # with overlong masking a turn cut at max_new_tokens trains nothing: before the last, that turn alone
        kept = plan_update(table, GRPOConfig(dynamic_sampling=False)).samples
        if turns[-1].finish_reason == "length":  # the whole episode was truncated
            assert kept == []
            continue
        cut = [c.finish_reason == "length" for c in turns[:-1]]
        cut_early += sum(cut)
        assert [s.loss_tokens for s in kept] == [sum(len(c.completion_ids) for c, x in zip(turns, [*cut, False],
                                                                                             strict=True) if not x)]
    assert cut_early > 0  # 12 new tokens per turn: some turns before the last were cut


def _loss_and_grads(model: torch.nn.Module, rows: list[dict[str, Any]], old_logprobs: list[list[float]],
                    completions: list[list[int]] | None = None) -> tuple[torch.Tensor, list[torch.Tensor],
                                                                          torch.Tensor]:
    """The GRPO objective of the rows as the update computes it, its parameter gradients, and the gradient of the
    loss with respect to every token's log-prob column."""
    model.zero_grad(set_to_none=True)
    batch = collate([r["prompt_ids"] for r in rows], completions or [r["completion_ids"] for r in rows],
                    old_logprobs, [1.0, 0.5][:len(rows)], pad_id=0, loss_masks=[r["loss_mask"] for r in rows])
    logp, _ = sequence_logprobs(model, batch.input_ids, batch.attention_mask, 1.0, batch.start)
    logp.retain_grad()
    terms = token_terms(logp, batch.old_logp, batch.advantages, clip_low=0.2, clip_high=0.28)
    loss = aggregate(terms.loss, batch.mask, "token-mean")
    loss.backward()
    assert logp.grad is not None
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None], logp.grad * (1 -
                                                                                                          batch.mask)


def test_feedback_tokens_move_neither_the_loss_nor_any_gradient(episodes, policy):
    from transformers import AutoModelForCausalLM

    rows, _ = episodes
    two = rows[:2]
    model = AutoModelForCausalLM.from_pretrained(str(policy)).float()
    torch.manual_seed(0)
    base_loss, base_grads, masked_grad = _loss_and_grads(model, two, [r["logprobs"] for r in two])
    assert base_loss != 0 and any(g.abs().sum() > 0 for g in base_grads)
    assert torch.count_nonzero(masked_grad) == 0  # no gradient reaches the prediction of a feedback token
    # perturb what is recorded under mask 0 (the log-probs there): bit-identical loss and gradients
    noisy = [[lp if m else float(torch.randn(()) * 5) for lp, m in zip(r["logprobs"], r["loss_mask"], strict=True)]
             for r in two]
    loss, grads, _ = _loss_and_grads(model, two, noisy)
    assert torch.equal(loss, base_loss) and all(torch.equal(a, b) for a, b in zip(grads, base_grads, strict=True))
    # feedback appended after the last sampled token (an episode cut on a limit): context for nothing trained
    tail = [{**r, "loss_mask": r["loss_mask"] + [0] * 7} for r in two]
    longer = [r["completion_ids"] + [5, 6, 7, 8, 9, 10, 11] for r in two]
    loss, grads, _ = _loss_and_grads(model, tail, [r["logprobs"] + [0.0] * 7 for r in two], longer)
    assert torch.allclose(loss, base_loss, rtol=0, atol=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(grads, base_grads, strict=True))


def test_feedback_shows_visible_cases_only_and_the_final_reward_is_the_full_tests(episodes):
    rows, engine = episodes
    for r in rows:
        problem = next(p for p in PROBLEMS if p.problem_id == r["problem_id"])
        shown = visible_cases(problem, 2)
        hidden = [c for c in problem.test_cases if c not in shown]
        assert shown and hidden
        observed = engine.tokenizer.decode([t for t, m in zip(r["completion_ids"], r["loss_mask"], strict=True)
                                            if not m])
        assert all(" ".join(c.split()) not in observed for c in hidden)
        assert r["outcome"] == "failed" and r["reward"] == 0.0 and r["turn_rewards"] == [0.0] * 4


def test_a_solution_passing_the_visible_cases_ends_the_episode_with_the_hidden_verdict(policy):
    """Scripted turns through the real judge: a wrong first answer gets feedback; the right second one ends the
    episode (all visible cases pass) with reward 1 from the full tests, and shaping adds per-turn credit."""
    problem = PROBLEMS[0]
    engine = HFEngine(policy)
    answers = ["    return None\n", problem.reference_solution or ""]
    engine.generate_ids = _scripted(engine, answers)  # type: ignore[method-assign]
    with JudgePool(LIMITS, workers=1) as pool:
        env = env_for(CodeFeedbackConfig(max_turns=3, shaping=0.5), engine, pool, PARAMS.max_new_tokens)
        (row,), _ = collect_rollouts(engine, env, [problem], 1, PARAMS, seed=0)
    assert row["turns"] == 2 and row["outcome"] == "passed"
    assert row["turn_rewards"] == [0.0, 1.5] and row["reward"] == 1.5  # 0 of 2 visible, then 2 of 2 + pass
    feedback = engine.tokenizer.decode([t for t, m in zip(row["completion_ids"], row["loss_mask"], strict=True)
                                        if not m])
    assert feedback.startswith("\n# Tests: 2 of 2 visible tests failed.\n# FAILED: ")


def _scripted(engine: HFEngine, texts: list[str]):
    answers = iter(texts)

    def generate_ids(contexts, k, params, seeds):
        out = []
        for context in contexts:
            group = []
            for _ in range(k):
                text = next(answers)
                ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
                group.append(Completion(text, list(context), ids, [-1.0] * len(ids), "stop"))
            out.append(group)
        return out

    return generate_ids


def test_visible_cases_run_with_the_problems_helpers_and_never_the_hidden_check(policy):
    """Augmented problems' cases call helpers their test program defines (and one runs the original check): a
    correct solution passes the visible ones (no feedback), and the case that runs the hidden check is not shown."""
    from dataclasses import replace

    base = PROBLEMS[1]
    helper = "def _same(a, b):\n    return a == b\n\n\ndef _original_check(candidate):\n    pass\n\n\n"
    cases = [c.replace("assert ", "assert _same(", 1).replace(" == ", ", ", 1) + ")" for c in base.test_cases]
    problem = replace(base, tests=helper + base.tests, test_cases=["_original_check(candidate)", *cases])
    assert visible_cases(problem, 2) == cases[:2]
    engine = HFEngine(policy)
    engine.generate_ids = _scripted(engine, [problem.reference_solution or ""])  # type: ignore[method-assign]
    with JudgePool(LIMITS, workers=1) as pool:
        env = env_for(CodeFeedbackConfig(max_turns=3), engine, pool, PARAMS.max_new_tokens)
        (row,), _ = collect_rollouts(engine, env, [problem], 1, PARAMS, seed=0)
    assert row["turns"] == 1 and row["outcome"] == "passed" and row["reward"] == 1.0


def test_a_turn_with_no_room_for_another_is_graded_as_the_last(policy):
    """When the feedback and a next turn would not fit the episode's tokens, the turn is judged by the full tests
    (not cut ungraded)."""
    problem = PROBLEMS[0]
    engine = HFEngine(policy)
    engine.generate_ids = _scripted(engine, ["    return None\n"])  # type: ignore[method-assign]
    prompt_tokens = len(engine.encode(problem.prompt, PARAMS.max_new_tokens))
    with JudgePool(LIMITS, workers=1) as pool:
        cfg = CodeFeedbackConfig(max_turns=3, max_total_tokens=prompt_tokens + 2 * PARAMS.max_new_tokens)
        (row,), _ = collect_rollouts(engine, env_for(cfg, engine, pool, PARAMS.max_new_tokens), [problem], 1, PARAMS,
                                     seed=0)
    assert row["turns"] == 1 and row["outcome"] == "failed" and row["finish_reason"] == "stop"
    assert all(row["loss_mask"])  # no feedback was appended


def test_feedback_format():
    from codemill.rl.env import StepInfo

    text = feedback_text(["assert candidate(1) == 2", "assert candidate(2) == 3"],
                         [StepInfo("failed", error="AssertionError\nmore"), StepInfo("passed", passed=True)],
                         "def f(x):\n", 40)
    assert text == ("\n# Tests: 1 of 2 visible tests failed.\n# FAILED: assert candidate(1) == 2\n"
                    "#   AssertionError\n# Write the function again.\ndef f(x):\n")
