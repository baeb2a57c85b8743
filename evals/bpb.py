"""Held-out bits-per-byte: summed negative log-likelihood in bits over the UTF-8 bytes it explains.

Tokenizer-independent, because the denominator is bytes, not tokens. The byte-level BPE is lossless, so the
token sequence of a file determines its bytes exactly. Each file is scored as ``[EOS] + tokens``, cut into
windows of ``context_len`` that overlap by one token, so every content token is predicted exactly once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

LN2 = math.log(2.0)


def nats_to_bits(nats: float) -> float:
    return nats / LN2


def bits_per_byte(nll_nats: float, n_bytes: int) -> float:
    if n_bytes <= 0:
        raise ValueError("bits-per-byte needs a positive byte count")
    return nats_to_bits(nll_nats) / n_bytes


def windows_for(ids: Sequence[int], bos_id: int, context_len: int) -> list[list[int]]:
    """Windows over [bos] + ids; window k predicts its tokens 1.. given the ones before, within the window."""
    seq = [bos_id, *ids]
    if len(seq) < 2:
        return []
    step = context_len - 1
    return [seq[s:s + context_len] for s in range(0, len(seq) - 1, step)]


@torch.no_grad()
def window_nll(model: torch.nn.Module, windows: list[list[int]], pad_id: int, batch_size: int,
               device: torch.device) -> np.ndarray:
    """Summed NLL (nats) of each window's predicted tokens (positions 1..len-1)."""
    out = np.zeros(len(windows), dtype=np.float64)
    order = sorted(range(len(windows)), key=lambda i: len(windows[i]))  # similar lengths batch together
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(windows[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            w = windows[i]
            ids[row, :len(w)] = torch.tensor(w)
            mask[row, :len(w)] = 1
        ids, mask = ids.to(device), mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target = ids[:, 1:].unsqueeze(-1)
        # -log_softmax(x)[t] = logsumexp(x) - x[t]: one pass over the vocabulary, and no second batch x window x
        # vocabulary tensor (the normalised one), which on a CPU costs more memory traffic than a small model's math
        nll = (torch.logsumexp(logits, dim=-1) - logits.gather(-1, target).squeeze(-1)) * mask[:, 1:]
        out[idx] = nll.sum(dim=1).double().cpu().numpy()
    return out


def file_nll(model: torch.nn.Module, token_ids: list[list[int]], *, bos_id: int, pad_id: int,
             context_len: int, batch_size: int, device: torch.device) -> np.ndarray:
    """Summed NLL (nats) per file."""
    windows, owner = [], []
    for f, ids in enumerate(token_ids):
        ws = windows_for(ids, bos_id, context_len)
        windows.extend(ws)
        owner.extend([f] * len(ws))
    nll = window_nll(model, windows, pad_id, batch_size, device)
    totals = np.zeros(len(token_ids), dtype=np.float64)
    np.add.at(totals, np.asarray(owner, dtype=np.int64), nll)
    return totals
