"""Token n-gram hashes for a batch of documents, computed column-wise (Polars + numpy, no per-document loop).

Tokens are maximal runs of ``[A-Za-z0-9_]``: the complement of BigCode's split on ``[^A-Za-z_0-9]``. Each
token is hashed by Polars (stable within one Polars version, which is why that version is part of every
digest that stores these hashes); n consecutive token hashes are combined by a polynomial over uint64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

TOKEN_PATTERN = r"[A-Za-z0-9_]+"
_TOKEN_SEED = 0x5EED
_MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class NgramHashes:
    """Flat n-gram hashes of a batch: ``hashes[i]`` belongs to document ``doc[i]`` (sorted by doc)."""

    hashes: np.ndarray  # uint64
    doc: np.ndarray  # int64, non-decreasing
    n_docs: int
    tokens_per_doc: np.ndarray  # int64


def token_hashes(texts: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(flat uint64 token hashes, tokens per document)."""
    toks = texts.str.extract_all(TOKEN_PATTERN)
    lengths = toks.list.len().fill_null(0).to_numpy().astype(np.int64)
    flat = toks.explode().drop_nulls().hash(_TOKEN_SEED).to_numpy().astype(np.uint64, copy=False)
    return flat, lengths


def ngram_hashes(texts: pl.Series, n: int) -> NgramHashes:
    """Hashes of every run of n consecutive tokens, per document. Documents with < n tokens get none."""
    return ngrams_from_tokens(*token_hashes(texts), n)


def ngrams_from_tokens(flat: np.ndarray, lengths: np.ndarray, n: int) -> NgramHashes:
    """Rolling combination over the flat token array (contiguous slices), then windows that cross a
    document boundary are masked out."""
    n_docs = len(lengths)
    total = len(flat) - (n - 1)
    if total <= 0:
        return NgramHashes(np.empty(0, np.uint64), np.empty(0, np.int64), n_docs, lengths)
    tok_doc = np.repeat(np.arange(n_docs, dtype=np.int64), lengths)
    h = flat[:total].copy()
    for k in range(1, n):
        h *= _MIX
        h += flat[k:k + total]
    inside = tok_doc[:total] == tok_doc[n - 1:n - 1 + total]
    return NgramHashes(h[inside], tok_doc[:total][inside], n_docs, lengths)
