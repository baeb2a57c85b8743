"""The tokenize stage as one pure function: train BPE on train, encode in batches, pack, write shards."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from codemill.config import TokenizeConfig
from codemill.data.corpus import read_split
from codemill.data.pack import Packer, ShardWriter, token_dtype
from codemill.data.tokenizer import EOS_TOKEN, save_tokenizer, train_bpe

TOKENIZE_CODE_VERSION = "tokenize-v1"


def run_tokenize(cfg: TokenizeConfig, corpus_dir: Path, out_dir: Path,
                 progress: Callable[[int, int], None] | None = None) -> dict:
    train = read_split(corpus_dir, "train")
    if train.height == 0:
        raise ValueError(f"{corpus_dir}: the train split is empty; nothing to tokenize")
    texts = train["content"].to_list()
    tok = train_bpe(texts, cfg.vocab_size, cfg.min_frequency)
    save_tokenizer(tok, out_dir / "tokenizer")
    eos_id = tok.token_to_id(EOS_TOKEN)
    vocab = tok.get_vocab_size()
    dtype = token_dtype(vocab)
    writer = ShardWriter(out_dir / "train", cfg.seq_len, dtype, cfg.sequences_per_shard)
    packer = Packer(eos_id, cfg.seq_len)
    n_tokens = 0
    for start in range(0, len(texts), cfg.batch_size):
        batch = tok.encode_batch(texts[start:start + cfg.batch_size], add_special_tokens=False)
        for enc in batch:
            n_tokens += len(enc.ids) + 1
            for row, positions in packer.add(enc.ids):
                writer.add(row, positions)
        if progress:
            progress(min(start + cfg.batch_size, len(texts)), len(texts))
    writer.flush()
    n_bytes = int(train["bytes"].sum())
    return {
        "vocab_size": vocab,
        "eos_id": eos_id,
        "dtype": dtype.name,
        "seq_len": cfg.seq_len,
        "files": train.height,
        "bytes": n_bytes,
        "tokens": n_tokens,
        "tokens_packed": sum(s["rows"] for s in writer.shards) * cfg.seq_len,
        "tokens_dropped": packer.leftover,
        "sequences": sum(s["rows"] for s in writer.shards),
        "bytes_per_token": round(n_bytes / max(n_tokens, 1), 4),
        "shards": writer.shards,
    }
