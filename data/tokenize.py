"""The tokenizer and tokenize stages as pure functions.

tokenizer: train a byte-level BPE on the train split, or take a base model's tokenizer (adding pad and FIM
sentinels). tokenize: stream the train shards, apply FIM, encode each shard with the Rust batch encoder
(parallel), pack into fixed-length rows with positions, write shards as they fill (bounded memory).

The stage should cost what its encode call costs (``benchmarks/tokenize.py`` holds it to the bare
``encode_batch_fast`` on the same texts), so everything around that call works on whole arrays: a batch's
documents become one flat id array plus per-document lengths, packing and shard writing slice those arrays,
and the next batch encodes on a worker thread while this one's ids are collected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import chain
from pathlib import Path

import numpy as np
import polars as pl
from tokenizers import Encoding, Tokenizer

from codemill.data import fim
from codemill.data.config import TokenizeConfig
from codemill.data.pack import ID_DTYPE, Packer, TokenShardWriter, token_dtype
from codemill.data.tokenizer import (
    load_tokenizer,
    load_tokenizer_info,
    prepare_base_tokenizer,
    save_tokenizer,
    train_bpe,
)

TOKENIZER_CODE_VERSION = "tokenizer-v2"
TOKENIZE_CODE_VERSION = "tokenize-v2"
ShardMapper = Callable[[Callable[[Path], "EncodedShard"], list[Path]], Iterable["EncodedShard"]]
FimPlan = tuple[str, tuple[str, ...]]


def train_shards(corpus_dir: Path) -> list[Path]:
    shards = sorted((corpus_dir / "train").glob("*.parquet"))
    if not shards:
        raise ValueError(f"{corpus_dir}: the train split is empty; nothing to tokenize")
    return shards


def iter_texts(shards: list[Path]) -> Iterator[list[str]]:
    for shard in shards:
        yield pl.read_parquet(shard, columns=["content"])["content"].to_list()


def build_tokenizer(cfg: TokenizeConfig, corpus_dir: Path | None, out_dir: Path) -> dict:
    """A base model's tokenizer as it is, or a BPE trained on the corpus's train split."""
    if cfg.base_tokenizer:
        return prepare_base_tokenizer(cfg.base_tokenizer, out_dir)
    if corpus_dir is None:
        raise ValueError("training a tokenizer needs a corpus (or set tokenize.base_tokenizer)")
    texts = (t for batch in iter_texts(train_shards(corpus_dir)) for t in batch)
    return save_tokenizer(train_bpe(texts, cfg.vocab_size, cfg.min_frequency), out_dir)


@dataclass(frozen=True)
class EncodedDocs:
    """Documents as one flat id array and each one's length (FIM already applied)."""

    ids: np.ndarray
    lengths: np.ndarray
    fim_documents: int

    @staticmethod
    def concat(parts: list[EncodedDocs]) -> EncodedDocs:
        if not parts:
            return EncodedDocs(np.empty(0, ID_DTYPE), np.empty(0, np.int64), 0)
        return EncodedDocs(np.concatenate([p.ids for p in parts]), np.concatenate([p.lengths for p in parts]),
                           sum(p.fim_documents for p in parts))

    def as_lists(self) -> list[list[int]]:
        return [a.tolist() for a in np.split(self.ids, np.cumsum(self.lengths)[:-1])] if len(self.lengths) else []


class DocumentEncoder:
    """Encode batches of documents (FIM applied per document) with the parallel Rust batch encoder."""

    def __init__(self, tok: Tokenizer, info: dict, cfg: TokenizeConfig) -> None:
        self.tok, self.cfg = tok, cfg
        self.fim_ids = fim.FimIds(*info["fim_ids"])

    def plan(self, texts: list[str], hashes: list[str]) -> tuple[list[FimPlan] | None, list[str]]:
        """Each document's FIM plan (None: FIM is off, every document is plain) and the texts to encode (a FIM
        document is three)."""
        if self.cfg.fim_rate <= 0:
            return None, texts
        plans = [fim.plan(t, fim.doc_rng(self.cfg.seed, h), self.cfg.fim_rate, self.cfg.fim_spm_rate)
                 for t, h in zip(texts, hashes, strict=True)]
        return plans, [part for _, parts in plans for part in parts]

    def encode_texts(self, texts: list[str]) -> list[Encoding]:
        """The one call that encodes (``encode_batch_fast``: no offsets, where this tokenizers has it)."""
        if hasattr(self.tok, "encode_batch_fast"):
            return self.tok.encode_batch_fast(texts, add_special_tokens=False)
        return self.tok.encode_batch(texts, add_special_tokens=False)

    def assemble(self, plans: list[FimPlan] | None, encoded: list[Encoding]) -> EncodedDocs:
        """The documents' ids in training order: each FIM document's parts with their sentinels (``fim.pieces``)
        chained straight into one array, never a list per document."""
        ids = [e.ids for e in encoded]
        n_fim = 0
        if plans is None:
            runs, lengths = ids, np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        else:
            runs, doc_lengths, i = [], [], 0
            for mode, parts in plans:
                doc = fim.pieces(mode, ids[i:i + len(parts)], self.fim_ids)
                i += len(parts)
                n_fim += mode != "plain"
                runs += doc
                doc_lengths.append(sum(map(len, doc)))
            lengths = np.asarray(doc_lengths, dtype=np.int64)
        flat = np.fromiter(chain.from_iterable(runs), dtype=ID_DTYPE, count=int(lengths.sum()))
        return EncodedDocs(flat, lengths, n_fim)

    def encode_batches(self, batches: Iterable[tuple[list[str], list[str]]]) -> Iterator[EncodedDocs]:
        """Each (texts, hashes) batch encoded, in order. Batch k+1 encodes on a worker thread (the Rust call
        releases the GIL) while batch k's ids are collected here, so that Python work fills the encoder's idle
        tail instead of adding to the wall time."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode") as pool:
            pending: tuple[list[FimPlan] | None, Future[list[Encoding]]] | None = None
            for texts, hashes in batches:
                plans, flat = self.plan(texts, hashes)
                future = pool.submit(self.encode_texts, flat)
                if pending is not None:
                    yield self.assemble(pending[0], pending[1].result())
                pending = (plans, future)
            if pending is not None:
                yield self.assemble(pending[0], pending[1].result())

    def encode(self, texts: list[str], hashes: list[str]) -> tuple[list[list[int]], int]:
        """Per-document id lists and the number of FIM documents (the stage itself stays on arrays)."""
        plans, flat = self.plan(texts, hashes)
        docs = self.assemble(plans, self.encode_texts(flat))
        return docs.as_lists(), docs.fim_documents


def encode_frame(encoder: DocumentEncoder, df: pl.DataFrame, batch_size: int) -> EncodedDocs:
    """A frame's ``content`` (FIM seeded by ``sha256``) encoded in batches of ``batch_size`` files."""
    batches = ((part["content"].to_list(), part["sha256"].to_list())
               for part in (df.slice(s, batch_size) for s in range(0, df.height, batch_size)))
    return EncodedDocs.concat(list(encoder.encode_batches(batches)))


@dataclass(frozen=True)
class EncodedShard:
    """One corpus shard encoded (FIM applied): the unit of work that may run on another process."""

    docs: EncodedDocs
    files: int
    bytes: int


def encode_shard(shard: Path, tokenizer_dir: Path, cfg: TokenizeConfig) -> EncodedShard:
    """Encode one train shard in batches. Pure: the same shard gives the same ids wherever it runs."""
    encoder = DocumentEncoder(load_tokenizer(tokenizer_dir), load_tokenizer_info(tokenizer_dir), cfg)
    df = pl.read_parquet(shard, columns=["content", "sha256", "bytes"])
    return EncodedShard(encode_frame(encoder, df, cfg.batch_size), df.height, int(df["bytes"].sum()))


def run_tokenize(cfg: TokenizeConfig, corpus_dir: Path, tokenizer_dir: Path, out_dir: Path,
                 progress: Callable[[int, int], None] | None = None, mapper: ShardMapper | None = None) -> dict:
    """Encode shards (through ``mapper``, e.g. on Ray workers) and pack them in shard order, so the packed rows
    do not depend on where or in which order the shards were encoded."""
    info = load_tokenizer_info(tokenizer_dir)
    tok = load_tokenizer(tokenizer_dir)
    writer = TokenShardWriter(out_dir / "train", cfg.seq_len, token_dtype(info["vocab_size"]), cfg.sequences_per_shard)
    packer = Packer(info["eos_id"], cfg.seq_len)
    shards = train_shards(corpus_dir)
    n_tokens = n_files = n_bytes = n_fim = 0
    encoded = (mapper or map)(partial(encode_shard, tokenizer_dir=tokenizer_dir, cfg=cfg), shards)
    for i, enc in enumerate(encoded):
        n_fim += enc.docs.fim_documents
        n_tokens += len(enc.docs.ids) + len(enc.docs.lengths)  # each document and its EOS
        writer.add_rows(*packer.add_docs(enc.docs.ids, enc.docs.lengths))
        n_files += enc.files
        n_bytes += enc.bytes
        if progress:
            progress(i + 1, len(shards))
    writer.flush()
    sequences = sum(s["rows"] for s in writer.shards)
    val_sequences = pack_plain_split(corpus_dir / "val", tok, info, cfg, out_dir / "val")
    return {
        "vocab_size": info["vocab_size"], "eos_id": info["eos_id"], "pad_id": info["pad_id"],
        "dtype": token_dtype(info["vocab_size"]).name, "seq_len": cfg.seq_len, "files": n_files, "bytes": n_bytes,
        "tokens": n_tokens, "tokens_packed": sequences * cfg.seq_len, "tokens_dropped": packer.leftover,
        "sequences": sequences, "fim_documents": n_fim, "bytes_per_token": round(n_bytes / max(n_tokens, 1), 4),
        "shards": writer.shards, "val_sequences": val_sequences,
    }


def pack_plain_split(split_dir: Path, tok: Tokenizer, info: dict, cfg: TokenizeConfig, out_dir: Path) -> int:
    """Held-out rows for the trainer's validation loss (no FIM: plain left-to-right text)."""
    plain = DocumentEncoder(tok, info, cfg.model_copy(update={"fim_rate": 0.0}))
    writer = TokenShardWriter(out_dir, cfg.seq_len, token_dtype(info["vocab_size"]), cfg.sequences_per_shard)
    packer = Packer(info["eos_id"], cfg.seq_len)
    for shard in sorted(split_dir.glob("*.parquet")):
        docs = encode_frame(plain, pl.read_parquet(shard, columns=["content", "sha256"]), cfg.batch_size)
        writer.add_rows(*packer.add_docs(docs.ids, docs.lengths))
    writer.flush()
    return sum(s["rows"] for s in writer.shards)
