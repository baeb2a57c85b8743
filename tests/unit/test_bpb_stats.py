import math

import numpy as np
import pytest
import torch

from codemill.evals.bpb import bits_per_byte, file_nll, windows_for
from codemill.evals.stats import bootstrap_ratio_ci


def test_bits_per_byte_hand_computed():
    # 3 bytes explained by a total NLL of 3*ln(2) nats = 3 bits -> exactly 1 bit per byte.
    assert bits_per_byte(3 * math.log(2), 3) == pytest.approx(1.0)
    # uniform over 256 symbols, one byte per token: 8 bits per byte.
    assert bits_per_byte(10 * math.log(256), 10) == pytest.approx(8.0)
    with pytest.raises(ValueError):
        bits_per_byte(1.0, 0)


def test_windows_predict_every_token_once():
    ids = list(range(1, 11))
    ws = windows_for(ids, bos_id=0, context_len=4)
    assert ws[0] == [0, 1, 2, 3]
    predicted = [t for w in ws for t in w[1:]]
    assert predicted == ids
    assert windows_for([], 0, 4) == []


class UniformLM(torch.nn.Module):
    """Equal logits everywhere: the NLL of every token is ln(vocab)."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids, attention_mask=None):
        class Out:
            pass
        o = Out()
        o.logits = torch.zeros(*input_ids.shape, self.vocab)
        return o


def test_file_nll_of_uniform_model_is_tokens_times_log_vocab():
    docs = [[5, 6, 7], list(range(2, 30)), [9]]
    nll = file_nll(UniformLM(64), docs, bos_id=0, pad_id=1, context_len=8, batch_size=3,
                   device=torch.device("cpu"))
    assert nll == pytest.approx([len(d) * math.log(64) for d in docs])


class RandomLM(torch.nn.Module):
    """Logits from the token and its position, so windows and padding matter."""

    def __init__(self, vocab):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.table = torch.randn(vocab, vocab, generator=gen) * 3
        self.pos = torch.randn(64, vocab, generator=gen)

    def forward(self, input_ids, attention_mask=None):
        class Out:
            pass
        o = Out()
        o.logits = self.table[input_ids] + self.pos[: input_ids.shape[1]]
        return o


def test_file_nll_is_the_log_softmax_of_every_predicted_token():
    docs = [[5, 6, 7], list(range(2, 30)), [9], [3] * 17]
    model = RandomLM(40)
    nll = file_nll(model, docs, bos_id=0, pad_id=1, context_len=8, batch_size=3, device=torch.device("cpu"))
    expected = []
    for d in docs:
        total = 0.0
        for w in windows_for(d, 0, 8):
            logp = torch.log_softmax(model(torch.tensor([w])).logits[0].double(), dim=-1)
            total -= sum(float(logp[i, w[i + 1]]) for i in range(len(w) - 1))
        expected.append(total)
    assert nll == pytest.approx(expected, rel=1e-6)


def test_bootstrap_ci_contains_point_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    num, den = rng.gamma(2.0, size=400), rng.integers(50, 500, size=400).astype(float)
    ci = bootstrap_ratio_ci(num, den, samples=2000, confidence=0.95, seed=1)
    assert ci.point == pytest.approx(num.sum() / den.sum())
    assert ci.low < ci.point < ci.high
    small = bootstrap_ratio_ci(num[:25], den[:25], samples=2000, confidence=0.95, seed=1)
    assert (small.high - small.low) > (ci.high - ci.low)
    assert bootstrap_ratio_ci(num, den, samples=2000, confidence=0.95, seed=1) == ci


def test_bootstrap_of_constant_ratio_is_degenerate():
    ci = bootstrap_ratio_ci(np.full(10, 2.0), np.full(10, 4.0), samples=200, confidence=0.9, seed=0)
    assert ci.low == pytest.approx(0.5) and ci.high == pytest.approx(0.5)
