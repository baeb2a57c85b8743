import numpy as np

from codemill.data.pack import Packer, TokenShardWriter, open_token_shards, token_dtype
from codemill.data.tokenizer import EOS_TOKEN, train_bpe


def test_dtype_by_vocab():
    assert token_dtype(4096) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32


def test_packing_inserts_eos_and_cuts_fixed_rows():
    packer = Packer(eos_id=0, seq_len=4)
    rows = [r for doc in ([1, 2, 3], [4, 5], [6, 7, 8, 9]) for r, _ in packer.add(doc)]
    assert [r.tolist() for r in rows] == [[1, 2, 3, 0], [4, 5, 0, 6], [7, 8, 9, 0]]


def test_packer_reports_leftover():
    p = Packer(eos_id=0, seq_len=5)
    out = [(r.tolist(), pos.tolist()) for ids in ([1, 2, 3], [4, 5, 6]) for r, pos in p.add(ids)]
    assert out == [([1, 2, 3, 0, 4], [0, 1, 2, 3, 0])] and p.leftover == 3


def test_positions_restart_per_document_and_per_row():
    p = Packer(eos_id=0, seq_len=4)
    rows = [(r.tolist(), pos.tolist()) for ids in ([5, 6], [7, 8, 9, 10, 11]) for r, pos in p.add(ids)]
    # docs: [5 6 EOS] [7 8 9 10 11 EOS]; the second continues into row 2, where it restarts at 0
    assert rows == [([5, 6, 0, 7], [0, 1, 2, 0]), ([8, 9, 10, 11], [0, 1, 2, 3])]


def test_shard_writer_memmaps(tmp_path):
    w = TokenShardWriter(tmp_path / "train", seq_len=3, dtype=np.dtype(np.uint16), rows_per_shard=2)
    for i in range(5):
        w.add(np.array([i, i, i]))
    w.flush()
    shards = open_token_shards(tmp_path / "train")
    assert [s.shape for s in shards] == [(2, 3), (2, 3), (1, 3)]
    assert [s.shape for s in open_token_shards(tmp_path / "train", "positions")] == [(2, 3), (2, 3), (1, 3)]
    assert isinstance(shards[0], np.memmap) and shards[0].dtype == np.uint16
    assert shards[2][0].tolist() == [4, 4, 4]


def test_bpe_is_lossless_and_has_eos():
    texts = ["def f(x):\n    return x + 1\n", "class A:\n\tpass  # café ✓\n"] * 20
    tok = train_bpe(texts, vocab_size=300, min_frequency=2)
    assert tok.token_to_id(EOS_TOKEN) == 0
    for t in texts[:2]:
        assert tok.decode(tok.encode(t, add_special_tokens=False).ids) == t


def test_split_digits_gives_every_digit_its_own_token_and_stays_lossless():
    texts = ["def add_55(x):\n    return x + 55  # 2024-12-04 0.5\n"] * 40
    merged = train_bpe(texts, vocab_size=300, min_frequency=2)
    split = train_bpe(texts, vocab_size=300, min_frequency=2, split_digits=True)
    assert any(len(t.strip("Ġ_")) > 1 and t.strip("Ġ_").isdigit() for t in merged.encode(texts[0]).tokens)
    tokens = split.encode(texts[0]).tokens
    assert [t for t in tokens if any(c.isdigit() for c in t)] == list("55552024120405")
    assert split.decode(split.encode(texts[0], add_special_tokens=False).ids) == texts[0]


def test_fim_psm_and_spm_layouts():
    import hashlib

    import numpy as np

    from codemill.data import fim

    ids = fim.FimIds(prefix=90, middle=91, suffix=92)
    parts = [[1, 2], [3], [4, 5]]
    assert fim.assemble("psm", parts, ids) == [90, 1, 2, 92, 4, 5, 91, 3]
    assert fim.assemble("spm", parts, ids) == [90, 92, 4, 5, 91, 1, 2, 3]
    assert fim.assemble("plain", [[7, 8]], ids) == [7, 8]
    text = "def f(x):\n    return x\n"
    mode, pieces = fim.plan(text, np.random.default_rng(0), fim_rate=1.0, spm_rate=0.5)
    assert mode in ("psm", "spm") and "".join(pieces) == text
    assert fim.plan(text, np.random.default_rng(0), fim_rate=0.0, spm_rate=0.5) == ("plain", (text,))
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(2000)]
    rates = [fim.plan(text, fim.doc_rng(0, h), 0.5, 0.5)[0] != "plain" for h in hashes]
    assert 0.45 < sum(rates) / len(rates) < 0.55


def test_fim_sentinels_are_single_tokens():
    from codemill.data.tokenizer import FIM_TOKENS

    tok = train_bpe(["def f(x):\n    return x\n"] * 20, vocab_size=300, min_frequency=2)
    for t in FIM_TOKENS:
        assert tok.encode(t, add_special_tokens=False).ids == [tok.token_to_id(t)]
