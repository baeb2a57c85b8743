"""Packing token streams into fixed-length sequences stored as memory-mappable .npy shards.

Each shard has a twin with per-token positions: the offset within the token's document, restarting at 0
at every document start and at the start of every row (a continued document is a new block in the next
row). The trainer turns them into ``position_ids`` and a block-causal attention mask.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def positions_from_starts(starts: np.ndarray) -> np.ndarray:
    """Offsets since the most recent True in ``starts`` (row-wise); position 0 always counts as a start."""
    starts = starts.copy()
    starts[..., 0] = True
    idx = np.broadcast_to(np.arange(starts.shape[-1]), starts.shape)
    last = np.maximum.accumulate(np.where(starts, idx, 0), axis=-1)
    return idx - last


class Packer:
    """Concatenate documents with EOS after each; emit full (tokens, positions) rows as they fill.

    The trailing partial row stays in the buffer; ``leftover`` says how many tokens a finished pack drops.
    """

    def __init__(self, eos_id: int, seq_len: int) -> None:
        self.eos_id, self.seq_len = eos_id, seq_len
        self.buf: list[int] = []
        self.starts: list[bool] = []

    def add(self, ids: list[int]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        self.buf.extend(ids)
        self.buf.append(self.eos_id)
        self.starts.append(True)
        self.starts.extend([False] * len(ids))
        n_full = len(self.buf) // self.seq_len
        if n_full:
            cut = n_full * self.seq_len
            toks = np.asarray(self.buf[:cut], dtype=np.int64).reshape(n_full, self.seq_len)
            pos = positions_from_starts(np.asarray(self.starts[:cut], dtype=bool).reshape(n_full, self.seq_len))
            del self.buf[:cut], self.starts[:cut]
            yield from zip(toks, pos, strict=True)

    @property
    def leftover(self) -> int:
        return len(self.buf)


class TokenShardWriter:
    """Collect packed rows; write [n, seq_len] token and position .npy shards of at most rows_per_shard rows."""

    def __init__(self, out_dir: Path, seq_len: int, dtype: np.dtype, rows_per_shard: int) -> None:
        self.out_dir, self.seq_len, self.dtype, self.rows_per_shard = out_dir, seq_len, dtype, rows_per_shard
        out_dir.mkdir(parents=True, exist_ok=True)
        self.rows: list[np.ndarray] = []
        self.pos: list[np.ndarray] = []
        self.shards: list[dict] = []

    def add(self, row: np.ndarray, positions: np.ndarray | None = None) -> None:
        self.rows.append(row)
        self.pos.append(np.arange(len(row)) if positions is None else positions)
        if len(self.rows) >= self.rows_per_shard:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        arr = np.stack(self.rows).astype(self.dtype)
        name = f"tokens-{len(self.shards):05d}.npy"
        np.save(self.out_dir / name, arr)
        np.save(self.out_dir / name.replace("tokens-", "positions-"), np.stack(self.pos).astype(np.uint16))
        self.shards.append({"file": f"{self.out_dir.name}/{name}", "rows": int(arr.shape[0])})
        self.rows, self.pos = [], []


def open_token_shards(token_dir: Path, kind: str = "tokens") -> list[np.ndarray]:
    """Memory-mapped [n, seq_len] arrays (``tokens`` or ``positions``), in shard order."""
    return [np.load(p, mmap_mode="r") for p in sorted(token_dir.glob(f"{kind}-*.npy"))]
