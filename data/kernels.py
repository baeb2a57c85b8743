"""Compiled kernels over a batch of texts held as one UTF-8 buffer: the per-byte work of the ingest steps that
Polars expressions cannot do in one pass (and a Python loop would do at ~100x the cost).

A kernel is a plain Python function compiled by numba on first use (``Kernel``), with the GIL released, so the
ingest's chunk threads run kernels in parallel. Texts reach it as ``utf8_buffer``'s (bytes, offsets): one Arrow
large_string buffer (a single copy out of Polars' string views, ~0.3 ms per MB), read in place by numpy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa


class Kernel:
    """A numba kernel (GIL released, machine code cached beside this file) compiled on first use: importing
    numba takes ~1.5 s, which a process that never runs the ingest (the CLI, a flow's start) should not pay."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn: Callable[..., Any] = fn
        self.compiled: Callable[..., Any] | None = None
        self.lock = threading.Lock()  # the ingest stage's chunk threads may all reach a kernel first at once

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            with self.lock:
                if self.compiled is None:
                    from numba import njit

                    try:
                        self.compiled = njit(cache=True, nogil=True)(self.fn)
                    except RuntimeError:  # no writable cache directory (a read-only install): compile in memory
                        self.compiled = njit(nogil=True)(self.fn)
        return self.compiled(*args)


def utf8_buffer(content: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(the UTF-8 bytes as uint8, int64 offsets from 0, one more than rows) of a String Series; nulls read as
    "". numpy views of the Arrow array's buffers (no copy beyond Polars' export)."""
    arr = content.to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.large_string())
    n = len(arr)
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.empty(0, np.uint8)
    return data[off[0]:off[-1]], off - off[0]
