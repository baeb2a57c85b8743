"""The compiled text kernels against their plain-Python definitions, on random texts with the edges that break
byte-level code: non-ASCII characters, empty and null documents, documents that are all separators, and a
sliced Series (Arrow offsets that do not start at 0)."""

import hashlib
import random
import re

import numpy as np
import polars as pl
import pytest

from codemill.data.dedup import normalized_hash, normalized_text
from codemill.data.filters import _CLASSES, ENCODED_PATTERNS, _text_stats
from codemill.data.kernels import utf8_buffer
from codemill.data.redact import PREFILTERS, _address_candidates
from codemill.data.shingles import TOKEN_PATTERN, ngrams_from_tokens, token_hash, token_hashes

PIECES = ["def", " ", "\n", "x_1", "é", "ça", "_", "42", "\t", "(", ")", "日本", "A", "\r\n", "+", "€", "__init__"]


def _texts(seed: int, n: int = 60) -> list[str | None]:
    rng = random.Random(seed)
    out: list[str | None] = ["", None, "   ", "é", "x"]
    out += ["".join(rng.choice(PIECES) for _ in range(rng.randrange(0, 80))) for _ in range(n)]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_token_hashes_equal_the_definition(seed):
    texts = _texts(seed)
    series = pl.Series(texts, dtype=pl.String)
    for s in (series, series.slice(7, 30)):  # a slice: Arrow offsets start past 0
        flat, lengths = token_hashes(s)
        tokens = [re.findall(TOKEN_PATTERN, t or "") for t in s.to_list()]
        assert lengths.tolist() == [len(t) for t in tokens]
        assert flat.tolist() == [token_hash(tok.encode()) for doc in tokens for tok in doc]


def test_token_hash_is_pinned_and_seeded():
    # the same value on every machine: if this changes, so must shingles.TOKEN_HASH (the digests name it)
    assert token_hash(b"def") == 0xDC518A31CBC3836D
    assert token_hash(b"def", seed=1) != token_hash(b"def")
    assert token_hashes(pl.Series(["def"]), seed=1)[0].tolist() == [token_hash(b"def", seed=1)]


@pytest.mark.parametrize("n", [1, 2, 5, 10])
def test_ngrams_equal_the_definition(n):
    rng = np.random.default_rng(n)
    lengths = rng.integers(0, 14, 40)
    flat = rng.integers(0, 2**63, int(lengths.sum()), dtype=np.uint64)
    ng = ngrams_from_tokens(flat, lengths, n)
    mix, m = 0x9E3779B97F4A7C15, 2**64 - 1
    want_h, want_doc, start = [], [], 0
    for d, length in enumerate(lengths.tolist()):
        toks = flat[start:start + length].tolist()
        for i in range(length - n + 1):
            h = 0
            for t in toks[i:i + n]:
                h = (h * mix + t) & m
            want_h.append(h)
            want_doc.append(d)
        start += length
    assert ng.hashes.tolist() == want_h and ng.doc.tolist() == want_doc and ng.n_docs == len(lengths)


WHITESPACE_PIECES = ["a", " ", "\t", "\r", "\n", "\r\n", " \r\n", "\u00a0", "\u3000", "\x0b", "\x0c", "\x1c", "é",
                     "x = 1", "\r\r\n"]


@pytest.mark.parametrize("seed", range(3))
def test_normalized_hash_equals_the_definition(seed):
    rng = random.Random(seed)
    texts = ["", None, " ", "\u00a0", "\u00a0 x \u3000\n"]
    texts += ["".join(rng.choice(WHITESPACE_PIECES) for _ in range(rng.randrange(0, 25))) for _ in range(2000)]
    series = pl.Series(texts, dtype=pl.String)
    for s in (series, series.slice(3, 500)):
        want = [None if t is None else hashlib.blake2b(t.encode(), digest_size=16).hexdigest()
                for t in s.to_frame("c").select(normalized_text(pl.col("c")))["c"].to_list()]
        assert normalized_hash(s).to_list() == want


def _suspects(texts: list[str]) -> list[bool]:
    data, off = utf8_buffer(pl.Series(texts, dtype=pl.String))
    n = len(texts)
    out = [np.empty(n, np.uint32), np.empty(n, np.uint32), np.empty(n, np.int64), np.empty(n, np.bool_),
           np.empty(n, np.bool_)]
    _text_stats(data, off, _CLASSES, *out)
    return out[4].tolist()


def _units(rng: random.Random, kind: str, k: int) -> str:
    digits = "0123456789abcdefABCDEF"
    if kind == "u":
        return "".join("\\u" + "".join(rng.choice(digits) for _ in range(4)) for _ in range(k))
    sep = rng.choice([", ", ",", " ", "\n", "\u00a0", " \t"])
    pre = rng.choice(["", "0x", "\\x"])
    return sep.join(pre + rng.choice(digits) + rng.choice(digits) for _ in range(k))


@pytest.mark.parametrize("seed", range(3))
def test_every_text_an_encoded_pattern_matches_is_a_suspect(seed):
    """The kernel's pre-filter may flag too much, never too little: the encoded-data statistics of a text it
    does not flag are taken as 0 without running the patterns."""
    rng = random.Random(seed)
    texts = []
    for _ in range(600):
        kind = rng.choice(["u", "hex", "b64", "mixed"])
        if kind == "b64":
            body = "".join(rng.choice("ABCxyz09+/=\n") for _ in range(rng.randrange(55, 75)))
        elif kind == "mixed":
            body = _units(rng, "hex", rng.randrange(5, 10)) + rng.choice(["é", "g", ")", "", "日"]) + _units(
                rng, rng.choice(["u", "hex"]), rng.randrange(5, 10))
        else:
            body = _units(rng, kind, rng.randrange(5, 11))
        texts.append(rng.choice(["", "x = ", "é", "(", "abc"]) + body + rng.choice(["", "abc", "é", "\n", "0"]))
    flagged = _suspects(texts)
    hits = [any(re.search(p, t) for p in ENCODED_PATTERNS) for t in texts]
    assert 100 < sum(hits) < len(texts)  # the texts sit on both sides of the patterns' thresholds
    assert all(f for f, h in zip(flagged, hits, strict=True) if h)
    code = ["def area(r):\n    return 3.14159 * r * r\n" * 20, "x = [1, 2, 3]\n" * 50, "# deadbeef cafe\n" * 9]
    assert _suspects(code) == [False] * 3  # and ordinary code is not flagged


@pytest.mark.parametrize("seed", range(3))
def test_address_candidates_hold_every_row_the_address_prefilters_match(seed):
    """Rows the IPv4/IPv6 pre-filter regexes match on ASCII text are all candidates (the regexes then run on
    those rows only); ordinary code is not one."""
    rng = random.Random(seed)
    pieces = ["1.2.3.4", "1.2.3", "12.255.1.", "1234.5.6.7", ".1.2.3", "١.2.3.4", "1.2.3.4.5", "9", "1:2:3",
              "1:2:3:4", "a::b", "fe80::1", "12345:1:2", "::1", "1::", "g:1:2:3", "beef:", ":"]
    joints = ["", "", ".", ":", " ", "x", "é", "\n", "0"]
    texts = ["".join(rng.choice(pieces) + rng.choice(joints) for _ in range(rng.randrange(0, 4)))
             for _ in range(3000)]
    ipv4, ipv6 = _address_candidates(pl.Series(texts, dtype=pl.String))
    for flags, name in ((ipv4, "IPV4"), (ipv6, "IPV6")):
        # ASCII digits: ``ipaddress`` never accepts a Unicode digit, so those matches are never redacted
        hits = pl.Series(texts).str.contains(PREFILTERS[name].replace(r"\d", "[0-9]")).to_list()
        assert 50 < sum(hits) < len(texts) - 50
        assert all(flags[i] for i, hit in enumerate(hits) if hit), name
    code = pl.Series(["x = d[1:2]\nv = '3.14.1'\nt = '12:30:00'\n" * 20, "import os.path\n"])
    assert [a or b for a, b in zip(*_address_candidates(code), strict=True)] == [False, False]
