"""The array-based tokenize stage against a plain list-based reference: same rows, positions and shards."""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import polars as pl
import pytest

from codemill.data import fim
from codemill.data.config import TokenizeConfig
from codemill.data.pack import Packer, TokenShardWriter, open_token_shards, positions_from_starts
from codemill.data.tokenize import DocumentEncoder, run_tokenize
from codemill.data.tokenizer import EOS_TOKEN, FIM_TOKENS, PAD_TOKEN, train_bpe


def test_add_docs_equals_one_document_at_a_time():
    rng = random.Random(0)
    docs = [[rng.randrange(1, 500) for _ in range(rng.choice([0, 1, 3, 7, 40]))] for _ in range(200)]
    one = Packer(eos_id=0, seq_len=16)
    expected = [(r.tolist(), p.tolist()) for d in docs for r, p in one.add(d)]
    many = Packer(eos_id=0, seq_len=16)
    got = []
    for lo in range(0, len(docs), 37):  # batches that end mid-row
        batch = docs[lo:lo + 37]
        flat = np.array([i for d in batch for i in d], dtype=np.uint32)
        rows, pos = many.add_docs(flat, np.array([len(d) for d in batch]))
        got += [(r.tolist(), p.tolist()) for r, p in zip(rows, pos, strict=True)]
    assert got == expected and many.leftover == one.leftover
    stream = [t for d in docs for t in (*d, 0)]  # what packing means: EOS after each document, cut into rows
    assert [r for r, _ in got] == [stream[i:i + 16] for i in range(0, len(stream) - 15, 16)]


def test_add_rows_cuts_at_shard_boundaries(tmp_path):
    rows = np.arange(7 * 3).reshape(7, 3)
    pos = positions_from_starts(rows % 4 == 0)
    a = TokenShardWriter(tmp_path / "a", 3, np.dtype(np.uint16), rows_per_shard=3)
    for r, p in zip(rows, pos, strict=True):
        a.add(r, p)
    a.flush()
    b = TokenShardWriter(tmp_path / "b", 3, np.dtype(np.uint16), rows_per_shard=3)
    b.add_rows(rows[:2], pos[:2])
    b.add_rows(rows[2:], pos[2:])
    b.flush()
    assert [s["rows"] for s in a.shards] == [s["rows"] for s in b.shards] == [3, 3, 1]
    for kind in ("tokens", "positions"):
        for x, y in zip(open_token_shards(tmp_path / "a", kind), open_token_shards(tmp_path / "b", kind),
                        strict=True):
            assert x.dtype == y.dtype and np.array_equal(x, y)


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    """A trained BPE and a two-shard train split (plus val) of small Python-like files."""
    root = tmp_path_factory.mktemp("tok")
    rng = random.Random(1)
    words = ["def", "return", "self", "x", "y", "(", ")", ":", "\n    ", "+", "import", "class", "é", "✓"]
    texts = ["".join(rng.choice(words) + " " for _ in range(rng.randrange(0, 120))) for _ in range(70)]
    tok = train_bpe(texts * 3, vocab_size=400, min_frequency=2)
    (root / "tokenizer").mkdir()
    tok.save(str(root / "tokenizer" / "tokenizer.json"))  # what the stage reads (no transformers import)
    info = {"vocab_size": tok.get_vocab_size(), "eos_id": tok.token_to_id(EOS_TOKEN),
            "pad_id": tok.token_to_id(PAD_TOKEN), "fim_ids": [tok.token_to_id(t) for t in FIM_TOKENS]}
    (root / "tokenizer" / "tokenizer_info.json").write_text(json.dumps(info))
    for split, chunk in (("train", texts[:30]), ("train", texts[30:60]), ("val", texts[60:])):
        (root / "corpus" / split).mkdir(parents=True, exist_ok=True)
        n = len(list((root / "corpus" / split).glob("*.parquet")))
        pl.DataFrame({"content": chunk, "sha256": [hashlib.sha256(t.encode()).hexdigest() for t in chunk],
                      "bytes": [len(t.encode()) for t in chunk]}).write_parquet(
            root / "corpus" / split / f"{split}-{n:05d}.parquet")
    return root, tok, info, texts


def reference_rows(tok, info, cfg: TokenizeConfig, texts: list[str], fim_on: bool) -> tuple[list, list]:
    """The stage written the obvious way: per document plan, encode each part alone, assemble, EOS, cut."""
    stream, starts = [], []
    for t in texts:
        h = hashlib.sha256(t.encode()).hexdigest()
        mode, parts = fim.plan(t, fim.doc_rng(cfg.seed, h), cfg.fim_rate if fim_on else 0.0, cfg.fim_spm_rate)
        ids = fim.assemble(mode, [tok.encode(p, add_special_tokens=False).ids for p in parts],
                           fim.FimIds(*info["fim_ids"]))
        starts += [True] + [False] * len(ids)
        stream += [*ids, info["eos_id"]]
    n = len(stream) // cfg.seq_len * cfg.seq_len
    rows = np.array(stream[:n]).reshape(-1, cfg.seq_len)
    return rows.tolist(), positions_from_starts(np.array(starts[:n]).reshape(-1, cfg.seq_len)).tolist()


@pytest.mark.parametrize("fim_rate", [0.0, 0.6])
def test_run_tokenize_matches_the_list_reference(tiny_corpus, tmp_path, fim_rate):
    root, tok, info, texts = tiny_corpus
    cfg = TokenizeConfig(vocab_size=400, seq_len=32, fim_rate=fim_rate, fim_spm_rate=0.5, batch_size=7,
                         sequences_per_shard=10)
    stats = run_tokenize(cfg, root / "corpus", root / "tokenizer", tmp_path / "out")
    rows, positions = reference_rows(tok, info, cfg, texts[:60], fim_on=True)
    for split, want_rows, want_pos in (("train", rows, positions),
                                       ("val", *reference_rows(tok, info, cfg, texts[60:], fim_on=False))):
        got = np.concatenate(open_token_shards(tmp_path / "out" / split))
        got_pos = np.concatenate(open_token_shards(tmp_path / "out" / split, "positions"))
        assert got.tolist() == want_rows and got_pos.tolist() == want_pos, split
        assert all(len(s) <= 10 for s in open_token_shards(tmp_path / "out" / split))
    assert stats["sequences"] == len(rows) and stats["files"] == 60
    assert (stats["fim_documents"] > 10) == (fim_rate > 0)
    assert stats["tokens"] == stats["tokens_packed"] + stats["tokens_dropped"]
    json.dumps(stats)  # the manifest stores them


def test_encoder_batches_equal_one_call_and_the_sentinels_are_placed(tiny_corpus):
    root, tok, info, texts = tiny_corpus
    cfg = TokenizeConfig(vocab_size=400, fim_rate=1.0, fim_spm_rate=0.5)
    enc = DocumentEncoder(tok, info, cfg)
    hashes = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
    whole, n_fim = enc.encode(texts, hashes)
    batched = [d for part in enc.encode_batches((texts[i:i + 9], hashes[i:i + 9]) for i in range(0, 70, 9))
               for d in part.as_lists()]
    assert batched == whole and n_fim == len(texts)  # FIM rate 1: every document
    p, m, s = (tok.token_to_id(t) for t in FIM_TOKENS)
    assert all(d[0] == p and d.count(p) == d.count(m) == d.count(s) == 1 for d in whole)
    assert 10 < sum(d[1] == s for d in whole) < 60  # SPM (suffix first) about half the time
