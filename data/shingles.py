"""Token n-gram hashes for a batch of documents: one compiled pass over the batch's UTF-8 bytes.

Tokens are maximal runs of ``[A-Za-z0-9_]`` (``TOKEN_PATTERN``: the complement of BigCode's split on
``[^A-Za-z_0-9]``; every other character, non-ASCII ones included, separates tokens). A token's hash is
64-bit FNV-1a over its bytes (the offset basis mixed with ``TOKEN_SEED``) through splitmix64's finaliser:
defined here, byte for byte, so the hashes (and every MinHash signature and decontamination index built from
them) are the same on any machine and any library version (``TOKEN_HASH`` names the definition). n
consecutive token hashes are combined by a polynomial over uint64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from codemill.data.kernels import Kernel, utf8_buffer

TOKEN_PATTERN = r"[A-Za-z0-9_]+"
TOKEN_HASH = "fnv1a64-splitmix-v1"  # part of the near-dedup algorithm's name: change it with the definition
TOKEN_SEED = 0x5EED
_FNV_PRIME = np.uint64(0x100000001B3)
_FNV_BASIS = np.uint64(0xCBF29CE484222325)
_MIX = np.uint64(0x9E3779B97F4A7C15)
NGRAM_MIX = _MIX  # n tokens combine as sum(t[i + k] * NGRAM_MIX^(n - 1 - k)), over uint64
_WORD = np.zeros(256, dtype=np.bool_)
for _lo, _hi in ((48, 57), (65, 90), (97, 122), (95, 95)):
    _WORD[_lo:_hi + 1] = True


@dataclass(frozen=True)
class NgramHashes:
    """Flat n-gram hashes of a batch: ``hashes[i]`` belongs to document ``doc[i]`` (sorted by doc)."""

    hashes: np.ndarray  # uint64
    doc: np.ndarray  # int64, non-decreasing
    n_docs: int
    tokens_per_doc: np.ndarray  # int64


def token_hash(token: bytes, seed: int = TOKEN_SEED) -> int:
    """One token's hash, in plain Python: the definition the kernel computes (tests hold them equal)."""
    m = 2**64 - 1
    h = (int(_FNV_BASIS) ^ seed) & m
    for b in token:
        h = ((h ^ b) * int(_FNV_PRIME)) & m
    z = (h + int(_MIX)) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def token_hashes(texts: pl.Series, seed: int = TOKEN_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(flat uint64 token hashes, tokens per document); a null document has no tokens."""
    data, off = utf8_buffer(texts)
    lengths = np.empty(len(off) - 1, dtype=np.int64)
    _count_tokens(data, off, _WORD, lengths)
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    flat = np.empty(int(starts[-1]) + 1, dtype=np.uint64)
    _hash_tokens(data, off, _WORD, _FNV_BASIS ^ np.uint64(seed), starts, flat)
    return flat[:-1], lengths


@Kernel
def _count_tokens(data: np.ndarray, off: np.ndarray, word: np.ndarray,
                  counts: np.ndarray) -> None:  # pragma: no cover - compiled
    for d in range(len(counts)):  # token starts: a word byte after a non-word byte (branch-free)
        c, prev = 0, False
        for i in range(off[d], off[d + 1]):
            w = word[data[i]]
            c += w & ~prev
            prev = w
        counts[d] = c


@Kernel
def _hash_tokens(data: np.ndarray, off: np.ndarray, word: np.ndarray, basis: np.uint64, starts: np.ndarray,
                 out: np.ndarray) -> None:  # pragma: no cover - compiled
    """Branch-free over the bytes (token edges are unpredictable): every byte stores the running hash at
    ``out[k]`` and ``k`` moves on only where a token just ended, so the slot keeps that token's hash (``out``
    has one slot of slack for the last document's last store)."""
    for d in range(len(off) - 1):
        k, h, prev = starts[d], basis, False
        for i in range(off[d], off[d + 1]):
            b = data[i]
            w = word[b]
            out[k] = h
            k += prev & ~w
            h = (h ^ np.uint64(b)) * _FNV_PRIME if w else basis
            prev = w
        out[k] = h
    for k in range(starts[-1]):
        z = out[k] + _MIX
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out[k] = z ^ (z >> np.uint64(31))


def ngram_hashes(texts: pl.Series, n: int) -> NgramHashes:
    """Hashes of every run of n consecutive tokens, per document. Documents with < n tokens get none."""
    return ngrams_from_tokens(*token_hashes(texts), n)


def ngrams_from_tokens(flat: np.ndarray, lengths: np.ndarray, n: int) -> NgramHashes:
    """Per document, the hash of each window of n consecutive tokens: ``sum(t[i + k] * MIX^(n - 1 - k))``
    over uint64 (a window never crosses a document boundary)."""
    n_docs = len(lengths)
    per_doc = np.maximum(lengths - (n - 1), 0)
    starts = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(per_doc, out=starts[1:])
    hashes = np.empty(int(starts[-1]), dtype=np.uint64)
    if len(hashes):
        _ngrams(flat, lengths, n, starts, hashes)
    return NgramHashes(hashes, np.repeat(np.arange(n_docs, dtype=np.int64), per_doc), n_docs, lengths)


@Kernel
def _ngrams(flat: np.ndarray, lengths: np.ndarray, n: int, starts: np.ndarray,
            out: np.ndarray) -> None:  # pragma: no cover - compiled
    t = 0
    for d in range(len(lengths)):
        for w in range(starts[d + 1] - starts[d]):
            h = flat[t + w]
            for k in range(1, n):
                h = h * _MIX + flat[t + w + k]
            out[starts[d] + w] = h
        t += lengths[d]
