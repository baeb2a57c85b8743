"""The built-in rollout engine on a tiny real model: log-probs as the update recomputes them, stop sequences cut text
and token ids alike, finish reasons, determinism independent of batching, weight sync; the rollouts table."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from codemill.models.engines import (
    HFEngine,
    RolloutEngine,
    RolloutParams,
    sample_from,
    teacher_forced_logprobs,
)
from codemill.problems.synthetic import synthetic_problems
from codemill.rl.trajectory import ROLLOUT_SCHEMA, RolloutsSchemaError, read_rollouts, write_rollouts
from tests.tiny_policy import make_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [p.prompt for p in synthetic_problems(3, 6)]
SEEDS = [11, 12, 13, 14, 15, 16]


@pytest.fixture(scope="module")
def engine(policy) -> HFEngine:
    return HFEngine(policy, rows_per_forward=64)


def _flat(groups):
    return [c for g in groups for c in g]


def test_logprobs_equal_a_teacher_forced_recompute(engine):
    """Incremental decoding with a KV cache under left padding gives the log-probs one unpadded forward pass gives
    (the update's recompute), at temperature != 1 and with top-p truncation (the log-prob is before truncation)."""
    assert isinstance(engine, RolloutEngine)
    params = RolloutParams(temperature=0.7, top_p=0.9, max_new_tokens=20)
    out = engine.generate(PROMPTS, 3, params, SEEDS)
    assert [len(g) for g in out] == [3] * len(PROMPTS)
    worst = 0.0
    for c in _flat(out):
        assert len(c.logprobs) == len(c.completion_ids) > 0
        ref = teacher_forced_logprobs(engine.model, c.prompt_ids, c.completion_ids, params.temperature)
        worst = max(worst, max(abs(a - b) for a, b in zip(ref, c.logprobs, strict=True)))
    assert worst < 1e-5
    # Left padding really happened: the prompts have different lengths.
    assert len({len(c.prompt_ids) for c in _flat(out)}) > 1


def test_every_sampled_token_is_inside_the_nucleus(engine):
    params = RolloutParams(temperature=1.0, top_p=0.5, max_new_tokens=12)
    for c in _flat(engine.generate(PROMPTS[:3], 2, params, SEEDS[:3])):
        ids = torch.tensor([c.prompt_ids + c.completion_ids])
        with torch.no_grad():
            logits = engine.model(input_ids=ids).logits[0, len(c.prompt_ids) - 1:-1].float()
        probs = torch.softmax(logits, -1)
        for row, tok in zip(probs, c.completion_ids, strict=True):
            mass_before = row[row > row[tok]].sum().item()  # mass of the strictly more likely tokens
            assert mass_before < 0.5 + 1e-6


def test_sample_from_follows_the_distribution():
    """Inverse-CDF draws land where the uniforms say, and never on a zero-probability or truncated token."""
    logp = torch.log(torch.tensor([[0.1, 0.0, 0.6, 0.3]]))
    pick = [sample_from(logp, 1.0, torch.tensor([u])).item() for u in (0.05, 0.2, 0.69, 0.71, 0.999)]
    assert pick == [0, 2, 2, 3, 3]
    # top_p 0.7: the nucleus is {2 (0.6), 3 (0.3)}, renormalised to 2/3, 1/3.
    pick = [sample_from(logp, 0.7, torch.tensor([u])).item() for u in (0.0, 0.6, 0.7, 0.999)]
    assert pick == [2, 2, 3, 3]


def test_stop_sequences_cut_text_and_token_ids_consistently(engine):
    """With a stop string, each sample is the unstopped sample (same seeds) up to the token that completes the
    stop: the text is cut before the stop, completion_ids end at that token, the log-probs are the same prefix."""
    free = RolloutParams(temperature=1.0, max_new_tokens=24)
    base = _flat(engine.generate(PROMPTS, 2, free, SEEDS))
    tok = engine.tokenizer
    # A stop string taken from the middle of one sample's text: it occurs in some samples and not in others.
    text = next(c.text for c in base if len(c.text) > 12 and "\ufffd" not in c.text[6:8])
    stop = text[6:8]
    stopped = _flat(engine.generate(PROMPTS, 2, RolloutParams(temperature=1.0, max_new_tokens=24, stop=(stop,)),
                                    SEEDS))
    hits = 0
    for full, cut in zip(base, stopped, strict=True):
        first = next((n for n in range(1, len(full.completion_ids) + 1)
                      if stop in tok.decode(full.completion_ids[:n], skip_special_tokens=True)), None)
        if first is None or (full.finish_reason == "eos" and first == len(full.completion_ids)):
            assert cut.completion_ids == full.completion_ids and cut.finish_reason == full.finish_reason
            assert cut.text == full.text and stop not in cut.text
            continue
        hits += 1
        assert cut.finish_reason == "stop"
        assert cut.completion_ids == full.completion_ids[:first]
        assert cut.logprobs == full.logprobs[:first]
        decoded = tok.decode(cut.completion_ids, skip_special_tokens=True)
        assert cut.text == decoded[:decoded.index(stop)] and stop not in cut.text
        assert stop not in tok.decode(cut.completion_ids[:-1], skip_special_tokens=True)
    assert hits >= 1


def test_finish_reasons_length_and_eos(engine):
    out = _flat(engine.generate(PROMPTS, 4, RolloutParams(temperature=1.3, max_new_tokens=10), SEEDS))
    reasons = {c.finish_reason for c in out}
    assert reasons <= {"length", "eos"} and "length" in reasons
    for c in out:
        if c.finish_reason == "length":
            assert len(c.completion_ids) == 10 and 0 not in c.completion_ids
        else:
            assert c.completion_ids[-1] == 0 and c.completion_ids.count(0) == 1 and len(c.completion_ids) <= 10
            assert c.text == engine.tokenizer.decode(c.completion_ids[:-1], skip_special_tokens=True)
    assert "eos" in reasons  # the untrained tiny model ends some samples with EOS at this temperature


def test_stop_token_ids_end_a_sample_and_token_in_equals_text_in(policy, engine):
    """A stop token ends its sample (kept as its last id, finish_reason stop); generate_ids on the encoded prompts
    samples what generate samples; an in-memory engine (the evaluations') samples what a folder's engine does."""
    params = RolloutParams(temperature=1.3, max_new_tokens=12)
    free = _flat(engine.generate(PROMPTS, 4, params, SEEDS))
    stop_id = next(t for c in free if c.finish_reason == "length" for t in c.completion_ids[2:5])
    stopped = _flat(engine.generate(PROMPTS, 4, RolloutParams(temperature=1.3, max_new_tokens=12,
                                                              stop_token_ids=(stop_id,)), SEEDS))
    hits = 0
    for a, b in zip(free, stopped, strict=True):
        if stop_id in a.completion_ids and (0 not in a.completion_ids
                                            or a.completion_ids.index(stop_id) < a.completion_ids.index(0)):
            hits += 1
            assert b.finish_reason == "stop" and b.completion_ids == a.completion_ids[:a.completion_ids.index(
                stop_id) + 1]
        else:
            assert b.completion_ids == a.completion_ids
    assert hits >= 1
    encoded = [engine.encode(p, 12) for p in PROMPTS]
    assert engine.generate_ids(encoded, 4, params, SEEDS) == engine.generate(PROMPTS, 4, params, SEEDS)
    in_memory = HFEngine.from_model(engine.model, engine.tokenizer, max_context=engine.max_context)
    assert in_memory.generate(PROMPTS, 4, params, SEEDS) == engine.generate(PROMPTS, 4, params, SEEDS)
    with pytest.raises(ValueError, match="exceeds the engine's context"):
        engine.generate_ids([[1] * engine.max_context], 1, params, [0])


def test_samples_do_not_depend_on_batching(policy, engine):
    """A prompt's samples depend on its seed only: the same whether it shares a forward pass with other prompts,
    runs alone, or runs in a smaller chunk of rows; another seed gives other samples."""
    params = RolloutParams(temperature=1.0, max_new_tokens=16)
    together = engine.generate(PROMPTS, 3, params, SEEDS)
    again = engine.generate(PROMPTS, 3, params, SEEDS)
    small_chunks = HFEngine(policy, rows_per_forward=4).generate(PROMPTS[::-1], 3, params, SEEDS[::-1])[::-1]
    alone = [engine.generate([p], 3, params, [s])[0] for p, s in zip(PROMPTS[:2], SEEDS[:2], strict=True)]
    assert together == again  # bit-identical for the same call
    for other in (small_chunks, alone):
        for g1, g2 in zip(together, other, strict=False):
            for a, b in zip(g1, g2, strict=True):
                assert (a.completion_ids, a.text, a.finish_reason) == (b.completion_ids, b.text, b.finish_reason)
                assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-5
    reseeded = engine.generate(PROMPTS, 3, params, [s + 100 for s in SEEDS])
    assert [c.completion_ids for c in _flat(reseeded)] != [c.completion_ids for c in _flat(together)]
    # The k samples of one prompt differ from each other.
    assert len({tuple(c.completion_ids) for c in together[0]}) == 3


def test_the_preallocated_kv_cache_samples_what_the_growing_one_does(engine, monkeypatch):
    """Writing keys and values into a buffer sized for the whole generation gives bit-identical tokens and
    log-probs to transformers' cache that concatenates at every step (with stops, mixed prompt lengths)."""
    from codemill.models import engines

    params = RolloutParams(temperature=1.0, max_new_tokens=24, stop=("\ndef ",))
    assert engines.preallocated_cache(engine.model, 8) is not None  # the tiny Llama takes it
    buffered = engine.generate(PROMPTS, 3, params, SEEDS)
    monkeypatch.setattr(engines, "preallocated_cache", lambda model, capacity: None)
    growing = engine.generate(PROMPTS, 3, params, SEEDS)
    assert [(c.completion_ids, c.logprobs, c.finish_reason) for c in _flat(buffered)] == \
        [(c.completion_ids, c.logprobs, c.finish_reason) for c in _flat(growing)]


def test_load_weights_syncs_the_engine_to_an_updated_policy(policy, tmp_path):
    other = make_policy(tmp_path / "other", seed=5)
    params = RolloutParams(temperature=1.0, max_new_tokens=12)
    fresh = HFEngine(other).generate(PROMPTS[:2], 2, params, SEEDS[:2])
    engine = HFEngine(policy)
    before = engine.generate(PROMPTS[:2], 2, params, SEEDS[:2])
    engine.load_weights(other)
    assert engine.generate(PROMPTS[:2], 2, params, SEEDS[:2]) == fresh != before
    assert engine.policy_dir == str(other)


def test_greedy_takes_the_most_likely_token_with_logprobs_at_temperature_one(engine):
    """temperature 0: every token is the argmax of the teacher-forced logits, the seeds and top_p do not matter,
    and the log-probs are the model's own (temperature 1) distribution's."""
    params = RolloutParams(temperature=0.0, max_new_tokens=12)
    out = engine.generate(PROMPTS[:3], 2, params, SEEDS[:3])
    assert out == engine.generate(PROMPTS[:3], 2, RolloutParams(temperature=0.0, top_p=0.5, max_new_tokens=12),
                                  [s + 100 for s in SEEDS[:3]])
    for a, b in out:
        assert a == b
        ids = torch.tensor([a.prompt_ids + a.completion_ids])
        with torch.no_grad():
            logits = engine.model(input_ids=ids).logits[0, len(a.prompt_ids) - 1:-1].float()
        assert logits.argmax(-1).tolist() == a.completion_ids
        ref = teacher_forced_logprobs(engine.model, a.prompt_ids, a.completion_ids, 0.0)
        assert ref == pytest.approx(torch.log_softmax(logits, -1).max(-1).values.tolist(), abs=1e-6)
        assert max(abs(x - y) for x, y in zip(ref, a.logprobs, strict=True)) < 1e-5


def test_bad_params_are_refused():
    with pytest.raises(ValueError, match="temperature"):
        RolloutParams(temperature=-0.1)
    with pytest.raises(ValueError, match="top_p"):
        RolloutParams(top_p=0.0)
    with pytest.raises(ValueError, match="stop"):
        RolloutParams(stop=("",))


def _row(group: int, sample: int, **kw):
    row = {"problem_id": f"p{group}", "group": group, "sample": sample, "prompt": "def f():\n", "completion": "  x",
           "prompt_ids": [1, 2], "completion_ids": [3, 4], "loss_mask": [1, 1], "logprobs": [-0.5, -1.25],
           "turn_starts": [0], "turns": 1, "turn_finish_reasons": ["stop"], "finish_reason": "stop", "reward": 1.0,
           "turn_rewards": [1.0],
           "partial": 1.0, "outcome": "passed", "duration_s": 0.01, "suspicious": "", "env_stats": "{}"}
    return {**row, **kw}


def test_rollouts_table_round_trips_with_the_exact_schema(tmp_path):
    two_turns = {"completion_ids": [3, 4, 9, 9, 5], "loss_mask": [1, 1, 0, 0, 1],
                 "logprobs": [-0.5, -1.0, 0.0, 0.0, -2.0], "turn_starts": [0, 4], "turns": 2,
                 "turn_finish_reasons": ["length", "stop"],
                 "turn_rewards": [0.0, 1.0], "finish_reason": "max_tokens", "reward": 0.0}  # cut: reward 0
    rows = [_row(0, 0), _row(0, 1, reward=0.0, turn_rewards=[0.0], partial=0.5, outcome="failed"),
            _row(1, 0, finish_reason="length", turn_finish_reasons=["length"]),
            _row(1, 1, **two_turns)]
    path = write_rollouts(rows, tmp_path)
    assert path == tmp_path / "rollouts.parquet"
    table = read_rollouts(path)
    assert table.schema == ROLLOUT_SCHEMA
    assert table.to_pylist() == rows
    assert [p.name for p in tmp_path.iterdir()] == ["rollouts.parquet"]  # no temporary file left


def test_rollouts_reader_says_what_is_wrong(tmp_path):
    good = pa.Table.from_pylist([_row(0, 0), _row(0, 1)], schema=ROLLOUT_SCHEMA)
    def bad(**kw) -> pa.Table:
        return pa.Table.from_pylist([_row(0, 0, **kw)], schema=ROLLOUT_SCHEMA)

    per_token = "one log-prob and one loss-mask value per completion token"
    turns = "do not describe their sampled turns"
    cases = [
        ("missing columns \\['reward'\\]", good.drop_columns(["reward"])),
        ("column 'group' is int64, expected int32", good.set_column(1, "group", pa.array([0, 0], pa.int64()))),
        ("unexpected columns \\['extra'\\]", good.append_column("extra", pa.array([1, 2]))),
        ("not sorted", pa.Table.from_pylist([_row(0, 1), _row(0, 0)], schema=ROLLOUT_SCHEMA)),
        (per_token, bad(logprobs=[-1.0])),
        (per_token, bad(loss_mask=[1])),
        (turns, bad(loss_mask=[0, 1])),  # a turn that starts on an observed token
        (turns, bad(turns=2)),
        (turns, bad(turn_rewards=[])),
        (turns, bad(turn_starts=[1], loss_mask=[0, 1])),
        (turns, bad(completion_ids=[3, 4, 9, 5], loss_mask=[1, 0, 1, 1], logprobs=[-1.0, 0.0, -1.0, -1.0])),
        ("loss_mask values other than 0 and 1", bad(loss_mask=[1, 2])),
        ("not the sum of their turn_rewards", bad(reward=0.5)),
        ("not the sum of their turn_rewards", bad(finish_reason="max_tokens")),
        ("unknown finish_reason", bad(finish_reason="eos_token")),
        ("one turn_finish_reasons value per turn", bad(turn_finish_reasons=[])),
        ("one turn_finish_reasons value per turn", bad(turn_finish_reasons=["stop", "stop"])),
        ("one turn_finish_reasons value per turn", bad(turn_finish_reasons=["max_tokens"])),
        ("one turn_finish_reasons value per turn", bad(turn_finish_reasons=["eos"])),  # the last is not finish_reason
    ]
    for i, (message, table) in enumerate(cases):
        path = tmp_path / f"bad{i}.parquet"
        pq.write_table(table, path)
        with pytest.raises(RolloutsSchemaError, match=message):
            read_rollouts(path)
    with pytest.raises(RolloutsSchemaError, match="not sorted"):
        write_rollouts([_row(1, 0), _row(0, 0)], tmp_path / "x.parquet")


def test_the_vllm_engine_says_what_is_missing(policy):
    import importlib.util

    from codemill.models.engines import VLLMEngine

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(RuntimeError, match="pip install vllm"):
        VLLMEngine(policy)


def test_a_prompt_shared_by_its_samples_is_prefilled_once_with_the_same_tokens(engine, monkeypatch):
    """The k samples of a prompt take its keys, values and first logits from one prefill row: bit-identical
    tokens and log-probs to prefilling every row, and the prefill forward sees each distinct prompt once."""
    from codemill.models import engines

    params = RolloutParams(temperature=1.0, max_new_tokens=16, stop=("\ndef ",))
    widths: list[int] = []
    forward = engine.model.forward

    def counted(*args, **kwargs):
        widths.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", counted)
    shared = engine.generate(PROMPTS, 4, params, SEEDS)
    assert widths[0] == len(PROMPTS) and widths[1] == 4 * len(PROMPTS)
    monkeypatch.setattr(engines.HFEngine, "_prefill", lambda self, ids, mask, positions, cache, prompt_ids:
                        self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                                   logits_to_keep=1, **{self._cache_arg: cache}))
    widths.clear()
    every_row = engine.generate(PROMPTS, 4, params, SEEDS)
    assert widths[0] == 4 * len(PROMPTS)
    assert [(c.completion_ids, c.logprobs, c.finish_reason) for c in _flat(shared)] == \
        [(c.completion_ids, c.logprobs, c.finish_reason) for c in _flat(every_row)]
