"""Block-causal attention for packed sequences: a token sees earlier tokens of its own document only.

Two forms of the same mask, chosen by ``attention_implementation``:

- ``flex_attention`` (CUDA): a FlexAttention ``BlockMask`` built from a mask_mod (same document and causal).
  transformers passes a 4D BlockMask through unchanged (``masking_utils._preprocess_mask_arguments``) to its
  ``flex_attention`` kernel, which torch.compiles to one fused kernel that skips every fully masked 128x128
  block (so cross-document blocks cost nothing) and never materialises a T x T mask.
- ``sdpa`` with a dense ``[B, 1, T, T]`` bool mask: everywhere else. torch 2.13 has no FlexAttention backward
  on CPU (``flex_attention._validate_device`` raises NotImplementedError for inputs that require grad), and
  transformers' flex path refuses attention dropout in training (``flex_attention_forward`` raises), so CPU
  training and dropout > 0 keep the dense mask. On CUDA a dense mask would push SDPA off its flash kernel.

Both forms are built from the same document ids (positions restart at 0 at each document and each row start,
see ``codemill.data.pack``); a unit test checks they give the same loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

FLEX = "flex_attention"
SDPA = "sdpa"


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Positions restart at 0 at each document start; the running count of restarts is the document id."""
    return torch.cumsum((position_ids == 0).to(torch.int64), dim=-1)


def document_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """A [B, 1, T, T] boolean mask (True = may attend): same document and not in the future."""
    doc = document_ids(position_ids)
    t = position_ids.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=position_ids.device).tril()
    same = doc.unsqueeze(-1) == doc.unsqueeze(-2)
    return (same & causal).unsqueeze(1)


def document_mask_mod(position_ids: torch.Tensor) -> Callable[..., torch.Tensor]:
    """FlexAttention mask_mod of ``document_mask``: the query's document equals the key's, key not after query."""
    doc = document_ids(position_ids)

    def same_document_causal(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
                             kv_idx: torch.Tensor) -> torch.Tensor:
        return (doc[b, q_idx] == doc[b, kv_idx]) & (q_idx >= kv_idx)

    return same_document_causal


def document_block_mask(position_ids: torch.Tensor) -> BlockMask:
    """The block-sparse ``document_mask``, one per micro-batch (heads share it).

    On CUDA the mask construction is compiled (once per shape: torch treats a recreated closure with the same
    code as the same mask_mod), elsewhere it runs eagerly (it materialises B x T x T booleans once)."""
    b, t = position_ids.shape
    return create_block_mask(document_mask_mod(position_ids), B=b, H=None, Q_LEN=t, KV_LEN=t,
                             device=position_ids.device, _compile=position_ids.device.type == "cuda")


def attention_implementation(device: torch.device, document_masking: bool, attention_dropout: float) -> str:
    """The transformers ``attn_implementation`` a training run uses: FlexAttention with a block mask where it
    can train (CUDA, no attention dropout) and document masking is on; SDPA otherwise (see the module doc)."""
    if document_masking and device.type == "cuda" and attention_dropout == 0:
        return FLEX
    return SDPA


def attention_inputs(position_ids: torch.Tensor, implementation: str) -> dict[str, torch.Tensor | BlockMask]:
    """``position_ids`` (RoPE restarts per document) and the document mask in the form the implementation takes."""
    mask = document_block_mask(position_ids) if implementation == FLEX else document_mask(position_ids)
    return {"position_ids": position_ids, "attention_mask": mask}
