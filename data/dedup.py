"""Corpus-wide duplicate resolution over the small per-file columns every chunk returns (no content).

Exact duplicates share the hash of the normalised content (line endings unified, trailing whitespace and
surrounding blank lines removed). Near duplicates are connected components of the MinHash LSH candidate
graph over the files left after exact dedup. In both cases the file with the smallest rank (the corpus
order: source, then path) is kept, so reruns keep the same file.
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl

from codemill.data.kernels import Kernel, utf8_buffer
from codemill.data.minhash import SKETCH_VALUES, band_keys, keep_one_per_component, lsh_components, signatures, sketch
from codemill.data.shingles import ngrams_from_tokens
from codemill.data.steps import ChunkContext, Step


def normalized_text(content: pl.Expr) -> pl.Expr:
    """The text exact dedup compares, by definition: CRLF as LF, spaces and tabs before a line end removed,
    surrounding whitespace (Unicode's) stripped. ``normalized_hash`` computes it in one compiled pass."""
    return (content.str.replace_all("\r\n", "\n", literal=True).str.replace_all(r"[ \t]+\n", "\n")
            .str.strip_chars())


def normalized_hash(content: pl.Series) -> pl.Series:
    """128-bit BLAKE2b of ``normalized_text``, hex (stable across versions, unlike Polars' hash); null for a
    null row. The kernel strips ASCII whitespace; a text whose stripped ends are non-ASCII (a no-break or
    ideographic space, say) gets Polars' Unicode strip on top."""
    data, off = utf8_buffer(content)
    n = len(off) - 1
    out, copied = np.empty_like(data), np.empty(n, np.bool_)
    lo, hi = np.empty(n, np.int64), np.empty(n, np.int64)
    _normalize(data, off, out, copied, lo, hi)
    views = (memoryview(data.data), memoryview(out.data))
    hashes: list[str | None] = []
    for a, b, c in zip(lo.tolist(), hi.tolist(), copied.tolist(), strict=True):
        text = views[c][a:b]
        if b > a and (text[0] >= 0x80 or text[-1] >= 0x80):
            text = pl.Series([bytes(text).decode()]).str.strip_chars()[0].encode()
        hashes.append(hashlib.blake2b(text, digest_size=16).hexdigest())
    return pl.Series("norm_hash", hashes, dtype=pl.String).set(content.is_null(), None)


@Kernel
def _normalize(data: np.ndarray, off: np.ndarray, out: np.ndarray, copied: np.ndarray, lo: np.ndarray,
               hi: np.ndarray) -> None:  # pragma: no cover - compiled; a test holds it to ``normalized_text``
    """Document d's normalised bytes are ``data[lo[d]:hi[d]]``, or ``out[lo[d]:hi[d]]`` where ``copied[d]``
    (within its own input span: the text only shrinks): CRLF -> LF as the bytes stream in (the CR is not
    kept), a run of spaces and tabs dropped when a LF ends it (the output rewinds to the run's start)."""
    for d in range(len(off) - 1):
        start, end = off[d], off[d + 1]
        dirty = 0  # a CR, space or tab before a LF: most files have none and are hashed in place
        for i in range(start, end - 1):
            c = data[i]
            dirty |= ((c == 13) | (c == 32) | (c == 9)) & (data[i + 1] == 10)
        copied[d] = dirty
        src = out if dirty else data
        o = end
        if dirty:  # branch-free per byte: spaces and line ends are too frequent to predict
            o, run = start, -1
            for i in range(start, end):
                c = data[i]
                skip = (c == 13) & (data[min(i + 1, end - 1)] == 10)  # the CR of a CRLF: dropped
                space = (c == 32) | (c == 9)
                o = run if (c == 10) & (run >= 0) else o
                run = (o if run < 0 else run) if space else (run if skip else -1)
                out[o] = c
                o += 1 - skip
        a = start
        while a < o and (src[a] == 32 or 9 <= src[a] <= 13):
            a += 1
        while o > a and (src[o - 1] == 32 or 9 <= src[o - 1] <= 13):
            o -= 1
        lo[d], hi[d] = a, o


def resolve_duplicates(candidates: pl.DataFrame, near: bool, min_similarity: float = 0.0) -> pl.DataFrame:
    """Rows to drop: ``rank, reason, kept_rank``.

    ``candidates`` has one row per file that passed the filters: ``rank`` (unique, the corpus order),
    ``norm_hash``, ``bands`` (Array of uint64 LSH band keys) and ``lsh_valid`` (enough tokens to shingle), and
    may have ``sketch`` (``minhash.sketch``): then two files sharing a band are near duplicates only when at
    least ``min_similarity`` of their sketch values agree.
    """
    df = candidates.sort("rank")
    first = df.group_by("norm_hash", maintain_order=True).agg(pl.col("rank").first().alias("kept_rank"))
    df = df.join(first, on="norm_hash", how="left")
    exact = df.filter(pl.col("rank") != pl.col("kept_rank")).select(
        "rank", pl.lit("exact_duplicate").alias("reason"), "kept_rank")
    if not near:
        return exact
    rest = df.filter(pl.col("rank") == pl.col("kept_rank"))
    if rest.height == 0:
        return exact
    keys = rest["bands"].to_numpy()
    if keys.ndim != 2:
        keys = np.stack(list(keys))  # an object column of per-row arrays
    rank = rest["rank"].to_numpy()
    sketches = None
    if "sketch" in rest.columns and min_similarity > 0:
        sketches = rest["sketch"].to_numpy()
        if sketches.ndim != 2:
            sketches = np.stack(list(sketches))
    labels = lsh_components(keys.astype(np.uint64, copy=False), rest["lsh_valid"].to_numpy(), sketches,
                            min_similarity)
    rep = keep_one_per_component(labels, rank)
    dropped = np.flatnonzero(rep != np.arange(len(rank)))
    near_df = pl.DataFrame({"rank": rank[dropped], "reason": ["near_duplicate"] * len(dropped),
                            "kept_rank": rank[rep[dropped]]}, schema={"rank": pl.Int64, "reason": pl.String,
                                                                     "kept_rank": pl.Int64})
    return pl.concat([exact.cast({"rank": pl.Int64, "kept_rank": pl.Int64}), near_df])


def _minhash_step(live: pl.DataFrame, ctx: ChunkContext) -> pl.DataFrame:
    """LSH band keys per row, from the text before redaction (a placeholder changes a few shingles at most)."""
    nd, proc = ctx.proc.cfg.near_dedup, ctx.proc
    flat, lengths = ctx.tokens(live)
    sig = signatures(ngrams_from_tokens(flat, lengths, nd.ngram), nd.num_perm, nd.seed, threads=1)
    return live.with_columns(pl.Series("bands", band_keys(sig, proc.bands, proc.rows),
                                       dtype=pl.Array(pl.UInt64, proc.bands)),
                             pl.Series("sketch", sketch(sig), dtype=pl.Array(pl.UInt16, SKETCH_VALUES)),
                             pl.Series("lsh_valid", lengths >= nd.ngram))


def _exact_hash_step(live: pl.DataFrame, ctx: ChunkContext) -> pl.DataFrame:
    """The exact-dedup hash of what will be written (after redaction)."""
    return live.with_columns(normalized_hash(live["content"]))


# Per chunk: the keys the corpus-wide dedup compares. Corpus-wide: ``resolve_duplicates`` gives the reasons.
MINHASH = Step("minhash", (), _minhash_step)
EXACT_HASH = Step("exact_hash", (), _exact_hash_step)
EXACT_DEDUP = Step("exact_dedup", ("exact_duplicate",))
NEAR_DEDUP = Step("near_dedup", ("near_duplicate",))
