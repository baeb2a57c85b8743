"""Packing token streams into fixed-length sequences stored as memory-mappable .npy shards."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class Packer:
    """Concatenate documents with EOS after each; emit full rows of seq_len tokens as they fill.

    The trailing partial row stays in the buffer; ``leftover`` says how many tokens a finished pack drops.
    """

    def __init__(self, eos_id: int, seq_len: int) -> None:
        self.eos_id, self.seq_len = eos_id, seq_len
        self.buf: list[int] = []

    def add(self, ids: list[int]) -> Iterator[np.ndarray]:
        self.buf.extend(ids)
        self.buf.append(self.eos_id)
        n_full = len(self.buf) // self.seq_len
        if n_full:
            cut = n_full * self.seq_len
            yield from np.asarray(self.buf[:cut], dtype=np.int64).reshape(n_full, self.seq_len)
            del self.buf[:cut]

    @property
    def leftover(self) -> int:
        return len(self.buf)


def pack_documents(docs: Iterable[list[int]], eos_id: int, seq_len: int) -> Iterator[np.ndarray]:
    packer = Packer(eos_id, seq_len)
    for ids in docs:
        yield from packer.add(ids)


class ShardWriter:
    """Collect packed rows and write them as [n, seq_len] .npy shards of at most rows_per_shard rows."""

    def __init__(self, out_dir: Path, seq_len: int, dtype: np.dtype, rows_per_shard: int) -> None:
        self.out_dir, self.seq_len, self.dtype, self.rows_per_shard = out_dir, seq_len, dtype, rows_per_shard
        out_dir.mkdir(parents=True, exist_ok=True)
        self.rows: list[np.ndarray] = []
        self.shards: list[dict] = []

    def add(self, row: np.ndarray) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.rows_per_shard:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        arr = np.stack(self.rows).astype(self.dtype)
        name = f"tokens-{len(self.shards):05d}.npy"
        np.save(self.out_dir / name, arr)
        self.shards.append({"file": f"{self.out_dir.name}/{name}", "rows": int(arr.shape[0])})
        self.rows = []


def open_token_shards(token_dir: Path) -> list[np.ndarray]:
    """Memory-mapped [n, seq_len] arrays, in shard order."""
    return [np.load(p, mmap_mode="r") for p in sorted(token_dir.glob("tokens-*.npy"))]
