"""A seeded, deterministic data order over packed sequences, sharded per rank.

The batch for (step, micro-step, rank) is a pure function of the seed, so the data cursor of a resumed run
is just the step: no sampler state can drift between an interrupted and an uninterrupted run.
"""

from __future__ import annotations

import numpy as np


class SequenceOrder:
    def __init__(self, n_sequences: int, seed: int) -> None:
        if n_sequences <= 0:
            raise ValueError("no packed sequences to train on")
        self.n, self.seed = n_sequences, seed
        self._epoch = -1
        self._perm = np.arange(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._epoch = epoch
        return self._perm

    def indices(self, step: int, micro: int, rank: int, *, world: int, micro_batch: int,
                accum: int) -> np.ndarray:
        """Global sequence ids for this rank's micro-batch; ranks never share a sequence within a step."""
        per_step = world * micro_batch * accum
        base = step * per_step + (micro * world + rank) * micro_batch
        out = np.empty(micro_batch, dtype=np.int64)
        for i in range(micro_batch):
            flat = base + i
            epoch, pos = divmod(flat, self.n)
            out[i] = self._permutation(epoch)[pos]
        return out


def gather_rows(shards: list[np.ndarray], offsets: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rows by global id across memory-mapped shards (offsets = cumulative row counts, starting at 0)."""
    shard_idx = np.searchsorted(offsets, ids, side="right") - 1
    return np.stack([np.asarray(shards[s][i - offsets[s]], dtype=np.int64) for s, i in zip(shard_idx, ids,
                                                                                         strict=True)])
