"""The ingest's fast paths give exactly what their plain definitions give: filter statistics read off the UTF-8
bytes against the Polars expressions that define them, on text built to hit every edge (non-ASCII letters next
to hex runs, non-ASCII spaces, multi-byte characters on long lines, empty lines, no final newline); the n-gram
index lookup against ``np.isin``; redaction (pre-filtered, per-line e-mail search, rewritten IPv4 pattern, secrets
tried only where a name starts) against every detector run over the whole text."""

import random
import re

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from codemill.data import redact as R
from codemill.data.config import RedactionConfig
from codemill.data.decontaminate import TABLE_BITS, NgramIndex, indexed_ngrams
from codemill.data.filters import fast_filter_stats, filter_stats, head_lines
from codemill.data.redact import redact_column, redact_text
from codemill.data.shingles import ngrams_from_tokens

EDGE_TEXTS = [
    "", "\n", "\n\n", "a", "a\n", "é", "é\n", "\r\n\r\n", "x = 1\r\ny = 2\r\n",
    "é" * 1200 + "\n" + "a" * 999, "a" * 1001, "ab\n" * 3 + "日本語" * 400,
    "é12 34 56 78 9a bc de f0 12 34", "12 34 56 78 9a bc de f0 12 34é", "\u00a012\u00a034 56 78 9a bc de f0 12 34",
    "x = [0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0]\n", "s = '\\x12\\x34\\x56\\x78\\x9a\\xbc\\xde\\xf0'\n",
    "é" + "QUJD" * 30 + "é" + "QUJD" * 30 + "\n", "日" + "A" * 70 + "\n" + "B" * 70, "\\u00e9" * 9 + "ü",
    "🙂 " * 300 + "\n" + "z" * 5, "ab,cd,ef,01,23,45,67,89,ab", "α1 β2 γ3 ab cd ef 01 23 45 67 89",
]
ALPHABET = list("ab09xX,\\u =+/\n\t ") + ["é", "日", "🙂", "\u00a0", "\u3000", "ß", "Ⅻ", "١"]


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        pieces = []
        for _ in range(rng.randint(0, 40)):
            kind = rng.random()
            if kind < 0.15:
                pieces.append(" ".join(rng.choice("0123456789abcdef") + rng.choice("0123456789abcdef")
                                       for _ in range(rng.randint(1, 12))))
            elif kind < 0.25:
                pieces.append("".join(rng.choice("ABCxyz09+/=\n") for _ in range(rng.randint(50, 120))))
            else:
                pieces.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30))))
        out.append("".join(pieces))
    return out


@pytest.mark.parametrize("texts", [EDGE_TEXTS, _random_texts(400)], ids=["edges", "random"])
def test_fast_filter_stats_equal_the_defining_expressions(texts):
    s = pl.Series("content", texts, dtype=pl.String)
    assert_frame_equal(fast_filter_stats(s), pl.DataFrame({"content": s}).select(filter_stats(pl.col("content"))))
    # a slice (Arrow offset not 0) reads the same bytes
    assert_frame_equal(fast_filter_stats(s.slice(3)), pl.DataFrame({"content": s.slice(3)}).select(
        filter_stats(pl.col("content"))))


@pytest.mark.parametrize("lines", [1, 2, 5])
def test_head_lines_equals_split_head_join(lines):
    df = pl.DataFrame({"content": EDGE_TEXTS + _random_texts(100, seed=1)})
    split = pl.col("content").str.split("\n").list.head(lines).list.join("\n").str.to_lowercase()
    fast = df.select(head_lines(pl.col("content"), lines)).to_series()
    assert fast.to_list() == df.select(split).to_series().to_list()


def test_indexed_ngrams_equal_every_ngram_looked_up_with_isin():
    rng = np.random.default_rng(0)
    vocab = rng.integers(0, 2**64, 50, dtype=np.uint64)  # few distinct tokens: many shared 3-grams
    lengths = rng.integers(0, 40, 300)
    flat = vocab[rng.integers(0, len(vocab), int(lengths.sum()))]
    ng = ngrams_from_tokens(flat, lengths, 3)
    indexed = np.unique(np.concatenate([ng.hashes[::11], rng.integers(0, 2**64, 5000, dtype=np.uint64)]))
    near = indexed ^ np.uint64(1)  # same top bits as an index entry: past the table, decided by the search
    table = np.zeros(1 << TABLE_BITS, dtype=np.bool_)
    table[indexed >> np.uint64(64 - TABLE_BITS)] = True
    index = NgramIndex(indexed, np.zeros(len(indexed), np.int64), np.ones(1, np.int64), ["t"], 0,
                       np.packbits(table, bitorder="little"))
    doc, hashes = indexed_ngrams(flat, lengths, 3, index)
    want = np.isin(ng.hashes, indexed)
    assert want.sum() > 300 and not np.isin(near, ng.hashes[want]).any()
    assert doc.tolist() == ng.doc[want].tolist() and hashes.tolist() == ng.hashes[want].tolist()
    assert len(indexed_ngrams(flat[:0], lengths[:0], 3, index)[0]) == 0


PLAIN_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.]|\.\d)")  # the pattern IPV4 rewrites
FRAGMENTS = [
    "owner@corp.io", "a.b@mail.example.com", "dev@example.com", "@property", "user@host", "x@y.z.io.", "é@corp.io",
    "host = 52.14.200.7", "version 1.2.3.4", "1.2.3.4.5", "server 10.0.0.1", "dns 8.8.8.8", "url 93.184.216.34",
    "ip 2a00:1450:4001:82b::200e", "addr 2001:db8::1", "fe80::1", "host 1:2:3:4:5:6:7:8", "a::b", "::1",
    "x[1::2]", "proxy ::ffff:2a00:1450", "peer 2a00:1450:4001::", "12:34:56", "١٢.٣.٤.٥",
    "AKIA2OGYBAH6STMMNXNN", 'password = "Zk3#9qLm!x2Vb7Tp"', 'api_key: "abcdefgh"',
    '\u017fecret = "Zk3#9qLm!x2Vb7TpQ"', 'to\u212aen = "Zk3#9qLm!x2Vb7TpQ"', 'ap\u0130_key = "Zk3#9qLm!x2Vb7TpQ"',
    'secredentials = "Zk3#9qLm!x2Vb7TpQ"', 'PASSWORD: "Zk3#9qLm!x2Vb7TpAA"', "client-secret => 'Ab3#9qLm!x2Vb7TpZZ'",
    'my_token="Yq8!pLm3#Zx9Wv2Rt"', 'token = "your-token-here-please"', "AUTH_KEY = 'Qw3#Er5%Ty7&Ui9*'",
]
SEPARATORS = [" ", "\n", "", ",", ".", ":", "\r\n", "\t", "=", "(", "_", "a", "9"]


def _redaction_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(FRAGMENTS) + rng.choice(SEPARATORS) for _ in range(rng.randint(0, 12)))
            for _ in range(n)]


def _flagged(name, text):
    return bool(pl.Series([text]).str.contains(R.PREFILTERS[name])[0])


def _reference_redact(text, cfg):
    """The plain definition: every detector over the whole text, in order, IPv4 with its lookbehind first;
    tokens and secrets only where their pre-filters fire, as before (Rust's case folding is not Python's:
    ``apİ_key`` matches the Python pattern, not the Rust pre-filter, and has never been redacted)."""
    out, counts = redact_text(text, cfg, frozenset({"TOKENS"} if _flagged("TOKENS", text) else ()))

    def secret(m):
        if not R._looks_like_secret(m.group("value"), cfg):
            return m.group(0)
        counts["SECRET"] += 1
        s, e = m.span("value")
        return m.group(0)[:s - m.start()] + "<SECRET>" + m.group(0)[e - m.start():]
    out = R.SECRET_ASSIGN.sub(secret, out) if _flagged("SECRET", text) else out
    out = R._sub(out, R.EMAIL, "EMAIL", counts, R._keep_email)
    out = R._sub(out, PLAIN_IPV4, "IP_ADDRESS", counts, R._keep_ipv4)
    out = R._sub(out, R.IPV6, "IP_ADDRESS", counts, R._keep_ipv6)
    return out, dict(counts)


def test_ipv4_pattern_matches_its_plain_form():
    rng = random.Random(3)
    texts = ["".join(rng.choice("0123456789..a_ \n:١") for _ in range(rng.randint(0, 60))) for _ in range(2000)]
    texts += [t for t in _redaction_texts(200)]
    for t in texts:
        assert [m.span() for m in R.IPV4.finditer(t)] == [m.span() for m in PLAIN_IPV4.finditer(t)], t


def test_redaction_equals_every_detector_over_the_whole_text():
    cfg = RedactionConfig()
    texts = _redaction_texts(600)
    got, per_row = redact_column(pl.Series("content", texts, dtype=pl.String), cfg)
    ref = [_reference_redact(t, cfg) for t in texts]
    assert got.to_list() == [r[0] for r in ref]
    assert per_row == [r[1] for r in ref]
    assert sum(r[1].get("IP_ADDRESS", 0) for r in ref) > 50 and sum(r[1].get("EMAIL", 0) for r in ref) > 50
    assert sum(r[1].get("SECRET", 0) for r in ref) > 50


def test_secret_names_fold_only_through_the_listed_characters():
    """What ``secret_matches`` relies on: besides its two cases, (?i) matches an ASCII letter of a name's start
    only to a character of CASE_FOLDS, and only one of those (İ) lower-cases to more than one character."""
    chars = "".join(chr(x) for x in range(0x110000) if not 0xD800 <= x < 0xE000)
    for letter in set("".join(R.SECRET_NAME_STARTS)):
        assert set(re.findall("(?i)" + letter, chars)) - {letter, letter.upper()} <= set(R.CASE_FOLDS), letter
    assert [c for c in chars if len(c.lower()) != 1] == ["\u0130"]
