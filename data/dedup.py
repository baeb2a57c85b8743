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

from codemill.data.minhash import SKETCH_VALUES, band_keys, keep_one_per_component, lsh_components, signatures, sketch
from codemill.data.shingles import ngrams_from_tokens
from codemill.data.steps import ChunkContext, Step


def normalized_hash(content: pl.Series) -> pl.Series:
    """128-bit BLAKE2b of the normalised text, hex (stable across versions, unlike Polars' hash)."""
    norm = (content.str.replace_all("\r\n", "\n", literal=True).str.replace_all(r"[ \t]+\n", "\n")
            .str.strip_chars())
    return pl.Series("norm_hash", [hashlib.blake2b(t.encode(), digest_size=16).hexdigest() if t is not None
                                   else None for t in norm.to_list()], dtype=pl.String)


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
