"""This rank's rows of the packed token shards: training micro-batches in the seeded order, and the held-out rows.

The micro-batch for (step, micro-step, rank) is a pure function of the seed (``SequenceOrder``), so a resumed
run reads exactly the batches an uninterrupted one would: the data cursor is the step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask

from codemill.data.pack import open_token_shards
from codemill.models.config import TrainConfig
from codemill.models.data_order import SequenceOrder, gather_rows
from codemill.models.masking import SDPA, attention_inputs
from codemill.models.parallel import Dist


def model_inputs(tokens: torch.Tensor, positions: torch.Tensor | None,
                 attention: str = SDPA) -> dict[str, torch.Tensor | BlockMask]:
    """Causal-LM keyword arguments; with positions, attention stays inside each packed document, through the
    mask form the model's attention implementation takes (a FlexAttention BlockMask, or a dense bool mask)."""
    inputs: dict[str, torch.Tensor | BlockMask] = {"input_ids": tokens, "labels": tokens}
    if positions is not None:
        inputs |= attention_inputs(positions, attention)
    return inputs


class Batches:
    """Memory-mapped train shards (and per-document positions when masking), read one micro-batch at a time."""

    def __init__(self, tokens_dir: Path, cfg: TrainConfig, d: Dist, attention: str = SDPA) -> None:
        self.cfg, self.d, self.attention = cfg, d, attention
        self.shards = open_token_shards(tokens_dir)
        self.positions = open_token_shards(tokens_dir, kind="positions") if cfg.document_masking else []
        rows = np.array([s.shape[0] for s in self.shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(rows)])
        self.sequences = int(rows.sum())
        self.order = SequenceOrder(self.sequences, cfg.seed)

    def micro_batch(self, step: int, micro: int) -> dict[str, torch.Tensor | BlockMask]:
        cfg, d = self.cfg, self.d
        ids = self.order.indices(step, micro, d.rank, world=d.world, micro_batch=cfg.micro_batch_size,
                                 accum=cfg.grad_accum_steps)
        tokens = torch.from_numpy(gather_rows(self.shards, self.offsets, ids)).to(d.device)
        positions = (torch.from_numpy(gather_rows(self.positions, self.offsets, ids)).to(d.device)
                     if self.positions else None)
        return model_inputs(tokens, positions, self.attention)


def held_out_rows(val_dir: Path, n: int, d: Dist) -> tuple[np.ndarray, np.ndarray | None] | None:
    """This rank's equal share of the first n held-out rows (tokens, positions), or None when off/absent."""
    shards = open_token_shards(val_dir) if n and val_dir.is_dir() else []
    if not shards:
        return None
    tokens = np.concatenate([np.asarray(s) for s in shards])[:n]
    pos_shards = open_token_shards(val_dir, kind="positions")
    positions = np.concatenate([np.asarray(s) for s in pos_shards])[:n] if pos_shards else None
    per_rank = len(tokens) // d.world
    if per_rank == 0:
        return None
    sl = slice(d.rank * per_rank, (d.rank + 1) * per_rank)
    return tokens[sl].astype(np.int64), None if positions is None else positions[sl].astype(np.int64)
