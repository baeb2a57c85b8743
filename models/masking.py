"""Block-causal attention for packed sequences: a token sees earlier tokens of its own document only."""

from __future__ import annotations

import torch


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
