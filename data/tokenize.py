"""The tokenizer and tokenize stages as pure functions.

tokenizer: train a byte-level BPE on the train split, or take a base model's tokenizer (adding pad and FIM
sentinels). tokenize: stream the train shards, apply FIM, encode each shard with the Rust batch encoder
(parallel), pack into fixed-length rows with positions, write shards as they fill (bounded memory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import polars as pl
from tokenizers import Tokenizer

from codemill.config import TokenizeConfig
from codemill.data import fim
from codemill.data.pack import Packer, TokenShardWriter, token_dtype
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


class DocumentEncoder:
    """Encode a batch of documents (FIM applied per document) in one parallel encode_batch call."""

    def __init__(self, tok: Tokenizer, info: dict, cfg: TokenizeConfig) -> None:
        self.tok, self.cfg = tok, cfg
        self.fim_ids = fim.FimIds(*info["fim_ids"])

    def encode(self, texts: list[str], hashes: list[str]) -> tuple[list[list[int]], int]:
        plans = [fim.plan(t, fim.doc_rng(self.cfg.seed, h), self.cfg.fim_rate, self.cfg.fim_spm_rate)
                 for t, h in zip(texts, hashes, strict=True)]
        flat = [part for _, parts in plans for part in parts]
        encoded = self.tok.encode_batch_fast(flat, add_special_tokens=False) if hasattr(
            self.tok, "encode_batch_fast") else self.tok.encode_batch(flat, add_special_tokens=False)
        out, i, n_fim = [], 0, 0
        for mode, parts in plans:
            ids = [encoded[i + k].ids for k in range(len(parts))]
            i += len(parts)
            n_fim += mode != "plain"
            out.append(fim.assemble(mode, ids, self.fim_ids))
        return out, n_fim


@dataclass(frozen=True)
class EncodedShard:
    """One corpus shard encoded (FIM applied): the unit of work that may run on another process."""

    docs: list[list[int]]
    fim_documents: int
    files: int
    bytes: int


def encode_shard(shard: Path, tokenizer_dir: Path, cfg: TokenizeConfig) -> EncodedShard:
    """Encode one train shard in batches. Pure: the same shard gives the same ids wherever it runs."""
    encoder = DocumentEncoder(load_tokenizer(tokenizer_dir), load_tokenizer_info(tokenizer_dir), cfg)
    df = pl.read_parquet(shard, columns=["content", "sha256", "bytes"])
    docs, n_fim = [], 0
    for start in range(0, df.height, cfg.batch_size):
        part = df.slice(start, cfg.batch_size)
        ids, fims = encoder.encode(part["content"].to_list(), part["sha256"].to_list())
        docs += ids
        n_fim += fims
    return EncodedShard(docs, n_fim, df.height, int(df["bytes"].sum()))


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
        n_fim += enc.fim_documents
        for ids in enc.docs:
            n_tokens += len(ids) + 1
            for row, positions in packer.add(ids):
                writer.add(row, positions)
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
        df = pl.read_parquet(shard, columns=["content", "sha256"])
        for start in range(0, df.height, cfg.batch_size):
            part = df.slice(start, cfg.batch_size)
            for ids in plain.encode(part["content"].to_list(), part["sha256"].to_list())[0]:
                for row, positions in packer.add(ids):
                    writer.add(row, positions)
    writer.flush()
    return sum(s["rows"] for s in writer.shards)
