"""Packing token streams into fixed-length sequences stored as memory-mappable .npy shards.

Each shard has a twin with per-token positions: the offset within the token's document, restarting at 0
at every document start and at the start of every row (a continued document is a new block in the next
row). The trainer turns them into ``position_ids`` and a block-causal attention mask.

Packing works on whole arrays (a shard's documents at once: flat ids plus per-document lengths), so its cost
stays a small fraction of the encode call that produced them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from codemill.data.kernels import Kernel

ID_DTYPE = np.dtype(np.uint32)  # token ids between encoder and writer (the shards use token_dtype)


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def positions_from_starts(starts: np.ndarray, dtype: np.dtype | type = np.int64) -> np.ndarray:
    """Offsets since the most recent True in ``starts`` (row-wise); position 0 always counts as a start."""
    out = np.empty(starts.shape, dtype=dtype)
    width = starts.shape[-1] if starts.ndim else 1
    _positions(np.ascontiguousarray(starts, dtype=np.bool_).reshape(-1, width), out.reshape(-1, width))
    return out


@Kernel
def _positions(starts: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """One pass, no full-size temporaries (each costs its page faults here, more than the arithmetic)."""
    for r in range(starts.shape[0]):
        p = 0
        for j in range(starts.shape[1]):
            p = 0 if starts[r, j] or j == 0 else p + 1
            out[r, j] = p


class Packer:
    """Concatenate documents with EOS after each; emit full (tokens, positions) rows as they fill.

    The trailing partial row stays in the buffer; ``leftover`` says how many tokens a finished pack drops.
    """

    def __init__(self, eos_id: int, seq_len: int) -> None:
        self.eos_id, self.seq_len = eos_id, seq_len
        self.buf = np.empty(0, dtype=ID_DTYPE)
        self.starts = np.empty(0, dtype=bool)

    def add_docs(self, ids: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Documents given as their ids concatenated plus each one's length: EOS goes after each, and the rows
        completed so far come back as two [n, seq_len] arrays (tokens, positions); n may be 0."""
        lengths = np.asarray(lengths, dtype=np.int64)
        ends = np.cumsum(lengths + 1)  # one past each document's EOS, in the new stream
        stream = np.empty(int(ends[-1]) if len(ends) else 0, dtype=ID_DTYPE)
        is_eos = np.zeros(len(stream), dtype=bool)
        is_eos[ends - 1] = True
        stream[is_eos] = self.eos_id
        stream[~is_eos] = ids
        starts = np.zeros(len(stream), dtype=bool)
        starts[ends - lengths - 1] = True
        buf = np.concatenate([self.buf, stream])
        starts = np.concatenate([self.starts, starts])
        cut = len(buf) // self.seq_len * self.seq_len
        self.buf, self.starts = buf[cut:].copy(), starts[cut:].copy()
        rows = buf[:cut].reshape(-1, self.seq_len)
        return rows, positions_from_starts(starts[:cut].reshape(-1, self.seq_len), np.uint16)

    def add(self, ids: list[int]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """One document; yields each completed (tokens, positions) row."""
        rows, positions = self.add_docs(np.asarray(ids, dtype=ID_DTYPE), np.array([len(ids)]))
        yield from zip(rows, positions, strict=True)

    @property
    def leftover(self) -> int:
        return len(self.buf)


class TokenShardWriter:
    """Collect packed rows; write [n, seq_len] token and position .npy shards of at most rows_per_shard rows."""

    def __init__(self, out_dir: Path, seq_len: int, dtype: np.dtype, rows_per_shard: int) -> None:
        self.out_dir, self.seq_len, self.dtype, self.rows_per_shard = out_dir, seq_len, dtype, rows_per_shard
        out_dir.mkdir(parents=True, exist_ok=True)
        self.rows: list[np.ndarray] = []  # [k, seq_len] blocks, fewer than rows_per_shard rows in all
        self.pos: list[np.ndarray] = []
        self.pending = 0
        self.shards: list[dict] = []

    def add(self, row: np.ndarray, positions: np.ndarray | None = None) -> None:
        self.add_rows(row[None], None if positions is None else positions[None])

    def add_rows(self, rows: np.ndarray, positions: np.ndarray | None = None) -> None:
        """A [n, seq_len] block of rows (and their positions; default 0..seq_len-1), cut at shard boundaries."""
        if positions is None:
            positions = np.broadcast_to(np.arange(rows.shape[1]), rows.shape)
        i = 0
        while i < len(rows):
            take = min(self.rows_per_shard - self.pending, len(rows) - i)
            self.rows.append(rows[i:i + take])
            self.pos.append(positions[i:i + take])
            self.pending += take
            i += take
            if self.pending >= self.rows_per_shard:
                self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        arr = np.concatenate(self.rows).astype(self.dtype)
        name = f"tokens-{len(self.shards):05d}.npy"
        np.save(self.out_dir / name, arr)
        np.save(self.out_dir / name.replace("tokens-", "positions-"), np.concatenate(self.pos).astype(np.uint16))
        self.shards.append({"file": f"{self.out_dir.name}/{name}", "rows": int(arr.shape[0])})
        self.rows, self.pos, self.pending = [], [], 0


def open_token_shards(token_dir: Path, kind: str = "tokens") -> list[np.ndarray]:
    """Memory-mapped [n, seq_len] arrays (``tokens`` or ``positions``), in shard order."""
    return [np.load(p, mmap_mode="r") for p in sorted(token_dir.glob(f"{kind}-*.npy"))]
