"""Document masking: the FlexAttention block mask (the CUDA training path) computes what the dense mask does.

The equality test runs transformers' real ``flex_attention`` path (torch.compile'd FlexAttention, inductor's
CPU kernel here) forward only: torch 2.13 has no FlexAttention backward on CPU, which is why CPU training keeps
the dense mask (``test_cpu_has_no_flex_backward`` goes red the day it has one). Gradients are compared on CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask, flex_attention

from codemill.data.pack import positions_from_starts
from codemill.models.batches import model_inputs
from codemill.models.build import build_model, use_attention
from codemill.models.config import ModelConfig
from codemill.models.masking import (
    FLEX,
    SDPA,
    attention_implementation,
    document_block_mask,
    document_mask,
    document_mask_mod,
)

T, VOCAB = 256, 97
TINY = ModelConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2)


def packed_positions() -> torch.Tensor:
    """Three packed rows: documents that cross the 128-token block boundary, one document filling a row, and
    many short documents; a row always starts a document (as ``codemill.data.pack`` writes them)."""
    starts = np.zeros((3, T), dtype=bool)
    starts[0, [100, 160]] = True
    starts[2, np.random.default_rng(0).choice(np.arange(1, T), size=20, replace=False)] = True
    return torch.from_numpy(positions_from_starts(starts)).to(torch.int64)


def causal_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return q_idx >= kv_idx


def test_attention_implementation_choice():
    """Flex only where it can train: CUDA, document masking on, no attention dropout; the model follows."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert attention_implementation(cuda, True, 0.0) == FLEX
    assert attention_implementation(cpu, True, 0.0) == SDPA
    assert attention_implementation(cuda, True, 0.1) == SDPA  # transformers' flex path raises on dropout
    assert attention_implementation(cuda, False, 0.0) == SDPA  # plain causal: SDPA's is_causal flash kernel
    model = build_model(TINY, VOCAB, T, 0, 1, seed=0)
    assert use_attention(model, cuda, True) == FLEX and model.config._attn_implementation == FLEX
    assert use_attention(model, cpu, True) == SDPA and model.config._attn_implementation == SDPA
    dropout = build_model(TINY.model_copy(update={"attention_dropout": 0.1}), VOCAB, T, 0, 1, seed=0)
    assert use_attention(dropout, cuda, True) == SDPA


def test_cpu_has_no_flex_backward():
    """Why CPU training keeps the dense mask; when torch adds the backward, reconsider the choice."""
    q = torch.randn(1, 1, 128, 16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(q, q, q)


def test_block_mask_is_the_dense_mask():
    """The mask_mod materialises to exactly the dense mask, and the block mask skips cross-document blocks."""
    pos = packed_positions()
    dense = document_mask(pos)
    assert torch.equal(create_mask(document_mask_mod(pos), 3, None, T, T, device="cpu"), dense)
    assert not torch.equal(dense, create_mask(causal_mod, 3, None, T, T, device="cpu").expand_as(dense))

    two_docs = torch.cat([torch.arange(128), torch.arange(128)]).unsqueeze(0)  # one document per 128-block
    blocks = document_block_mask(two_docs)
    assert isinstance(blocks, BlockMask) and blocks.shape == (1, 1, T, T)
    assert blocks.to_dense()[0, 0].tolist() == [[1, 0], [0, 1]]  # causal would be [[1, 0], [1, 1]]


def test_model_inputs_take_the_mask_form_of_the_implementation():
    tokens, pos = torch.zeros(3, T, dtype=torch.int64), packed_positions()
    flex, dense = model_inputs(tokens, pos, FLEX), model_inputs(tokens, pos, SDPA)
    assert isinstance(flex["attention_mask"], BlockMask) and flex["position_ids"] is pos
    assert isinstance(dense["attention_mask"], torch.Tensor)
    assert torch.equal(dense["attention_mask"], document_mask(pos))
    assert "attention_mask" not in model_inputs(tokens, None, FLEX)


@torch.no_grad()
def test_flex_block_mask_loss_equals_dense_mask_loss():
    """Same weights, same packed rows: transformers' flex_attention with our block mask gives the loss and logits
    of SDPA with the dense mask; a plain causal block mask (documents leaking) does not, so this can fail."""
    model = build_model(TINY, VOCAB, T, 0, 1, seed=0).eval()
    pos = packed_positions()
    tokens = torch.randint(2, VOCAB, pos.shape, generator=torch.Generator().manual_seed(0))

    use_attention(model, torch.device("cpu"), True)
    dense = model(**model_inputs(tokens, pos, SDPA))
    model.set_attn_implementation(FLEX)
    flex = model(**model_inputs(tokens, pos, FLEX))
    leaky = model(**(model_inputs(tokens, pos, FLEX) | {
        "attention_mask": create_block_mask(causal_mod, 3, None, T, T, device="cpu")}))

    assert abs(float(flex.loss - dense.loss)) <= 1e-5
    assert float((flex.logits - dense.logits).abs().max()) <= 1e-5
    assert abs(float(leaky.loss - dense.loss)) > 1e-4
    assert float((leaky.logits - dense.logits).abs().max()) > 1e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention trains on CUDA only")
def test_flex_block_mask_gradients_equal_dense_mask_gradients_on_cuda():
    """The training path itself: loss and every gradient of flex + block mask against SDPA + dense mask."""
    device = torch.device("cuda")
    pos = packed_positions().to(device)
    tokens = torch.randint(2, VOCAB, pos.shape, generator=torch.Generator().manual_seed(0)).to(device)
    runs = {}
    for impl in (SDPA, FLEX):
        with device:  # the same seeded weights on the device for both runs
            model = build_model(TINY, VOCAB, T, 0, 1, seed=0)
        model.set_attn_implementation(impl)
        loss = model(**model_inputs(tokens, pos, impl)).loss
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert len(grads) == len(list(model.parameters()))
        runs[impl] = loss.detach(), grads
    (dense_loss, dense_grads), (flex_loss, flex_grads) = runs[SDPA], runs[FLEX]
    assert abs(float(flex_loss - dense_loss)) <= 1e-4
    for name, g in dense_grads.items():
        assert float((flex_grads[name] - g).abs().max()) <= 1e-3 * float(g.abs().max()) + 1e-6, name
