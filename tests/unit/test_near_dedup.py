"""Near-dedup: one-permutation MinHash with optimal densification, LSH banding, exact clustering, versioning."""

import hashlib
import random

import numpy as np
import polars as pl
import pytest

from codemill.data.config import IngestConfig
from codemill.data.dedup import resolve_duplicates
from codemill.data.ingest import CHUNK_CODE_VERSION, INGEST_CODE_VERSION, prepare, run_ingest
from codemill.data.minhash import (
    ALGORITHM,
    NO_SIGNATURE,
    SKETCH_VALUES,
    _seed_words,
    band_keys,
    bin_order,
    keep_one_per_component,
    lsh_components,
    optimal_bands,
    signatures,
    sketch,
)
from codemill.data.shingles import ngram_hashes
from codemill.data.sources import FolderSource

VOCAB = [f"w{i}" for i in range(20000)]


def _doc(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(VOCAB) for _ in range(n)]


def _edit(rng: random.Random, words: list[str], k: int) -> list[str]:
    out = list(words)
    for i in rng.sample(range(len(out)), k):
        out[i] = rng.choice(VOCAB)
    return out


def _reference(hashes: np.ndarray, k: int, seed: int) -> np.ndarray:
    """One document, written the slow way: each bin's minimum, then each empty bin copies the first filled
    bin of its order."""
    order = bin_order(k, seed)[0]
    mult = int(_seed_words(seed, 3)[0] | np.uint64(1))
    own: dict[int, int] = {}
    for h in hashes.tolist():  # Python ints: the 64-bit product written out mod 2^64
        p = h * mult % 2**64
        b = ((p >> 32) * k) >> 32
        own[b] = min(own.get(b, 2**32), p % 2**32, 2**32 - 2)
    if not own:
        return np.full(k, NO_SIGNATURE, np.uint32)
    return np.array([own[next(int(s) for s in order[j] if int(s) in own)] for j in range(k)], np.uint32)


def test_signatures_equal_the_per_document_definition():
    # sizes on both sides of the sparse/dense switch, a document with one shingle, one with none
    rng = random.Random(1)
    docs = [" ".join(_doc(rng, n)) for n in (5, 6, 9, 14, 24, 40, 90, 300, 1500)] + ["too short"]
    ng = ngram_hashes(pl.Series(docs), 5)
    for k, seed in ((256, 42), (100, 7)):
        sig = signatures(ng, k, seed)
        for d in range(len(docs)):
            assert (sig[d] == _reference(ng.hashes[ng.doc == d], k, seed)).all(), (k, d)
    assert (sig[-1] == NO_SIGNATURE).all()


def test_bin_orders_start_at_their_bin_and_are_permutations_of_all_bins():
    order, rank = bin_order(64, 3)
    assert (np.take_along_axis(rank, order, axis=1) == np.arange(64)).all()
    assert (order[:, 0] == np.arange(64)).all()
    assert (np.sort(order, axis=1) == np.arange(64)).all()
    assert len({tuple(r[1:5]) for r in order.tolist()}) > 60  # the orders differ from bin to bin


def test_signature_agreement_estimates_jaccard():
    rng = random.Random(0)
    base = _doc(rng, 600)
    docs = [base, _edit(rng, base, 12), _doc(rng, 600), base[:40], _edit(rng, base[:40], 1)]
    ng = ngram_hashes(pl.Series([" ".join(d) for d in docs]), 5)
    sig = signatures(ng, 256, 42)
    sets = [set(ng.hashes[ng.doc == d].tolist()) for d in range(len(docs))]
    for a, b in ((0, 1), (3, 4), (0, 2)):
        exact = len(sets[a] & sets[b]) / len(sets[a] | sets[b])
        assert abs(float((sig[a] == sig[b]).mean()) - exact) < 0.1, (a, b)


def _groups(texts: list[str], seed: int = 42) -> np.ndarray:
    ng = ngram_hashes(pl.Series(texts), 5)
    keys = band_keys(signatures(ng, 256, seed), *optimal_bands(0.7, 256))
    return lsh_components(keys, ng.tokens_per_doc >= 5)


def test_known_near_duplicates_are_grouped_and_distinct_files_are_not():
    rng = random.Random(5)
    a, b = _doc(rng, 800), _doc(rng, 300)
    # a0-a2: one edit in 200 words or so (Jaccard ~0.9); b0-b1 likewise; c-e distinct, e shares a's vocabulary
    texts = [a, _edit(rng, a, 4), _edit(rng, a, 3), b, _edit(rng, b, 1), _doc(rng, 800), _doc(rng, 300),
             a[:250] + _doc(rng, 550)]
    labels = _groups([" ".join(t) for t in texts])
    assert labels[0] == labels[1] == labels[2]
    assert labels[3] == labels[4] != labels[0]
    assert len({labels[0], labels[3], labels[5], labels[6], labels[7]}) == 5


def test_results_are_deterministic_and_do_not_depend_on_the_batch():
    rng = random.Random(9)
    texts = [" ".join(_doc(rng, n)) for n in (12, 50, 400, 3000)]
    ng = ngram_hashes(pl.Series(texts), 5)
    sig = signatures(ng, 256, 42)
    assert (signatures(ng, 256, 42) == sig).all()
    alone = [signatures(ngram_hashes(pl.Series([t]), 5), 256, 42)[0] for t in texts]
    assert all((alone[i] == sig[i]).all() for i in range(len(texts)))
    rev = signatures(ngram_hashes(pl.Series(texts[::-1]), 5), 256, 42)
    assert (rev[::-1] == sig).all()
    assert not (signatures(ng, 256, 43) == sig).all()  # the seed matters


def test_signature_bytes_are_pinned():
    # the same bytes on every machine: if this changes, so must minhash.ALGORITHM (the digests name it)
    ng = ngram_hashes(pl.Series(["def f(x):\n    return x + 1\n" * 7, " ".join(f"t{i}" for i in range(700))]), 5)
    sig = signatures(ng, 256, 42)
    assert ALGORITHM == "oph-optimal-densification-v3-verified+fnv1a64-splitmix-v1"
    assert hashlib.sha256(sig.tobytes()).hexdigest()[:16] == "cbe452c20939298d"


def _brute_components(keys: np.ndarray, valid: np.ndarray, sketches: np.ndarray | None = None,
                      need: int = 0) -> list[set[int]]:
    n = len(keys)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for i in range(n):
        for j in range(i + 1, n):
            similar = sketches is None or int((sketches[i] == sketches[j]).sum()) >= need
            if valid[i] and valid[j] and (keys[i] == keys[j]).any() and similar:
                parent[find(j)] = find(i)
    groups: dict[int, set[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), set()).add(i)
    return sorted(groups.values(), key=min)


def test_clustering_is_exactly_the_connected_components_of_shared_bands():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 12, size=(60, 3)).astype(np.uint64)
    unique = rng.random(keys.shape) < 0.6  # most band values unique, some shared
    keys[unique] = np.uint64(1000) + np.arange(int(unique.sum()), dtype=np.uint64)
    valid = rng.random(60) > 0.1
    labels = lsh_components(keys, valid)
    got: dict[int, set[int]] = {}
    for i, lab in enumerate(labels.tolist()):
        got.setdefault(lab, set()).add(i)
    want = _brute_components(keys, valid)
    assert sorted(got.values(), key=min) == want
    assert 3 < len(want) < 55  # the example has real chains and singletons
    chain = np.array([[1, 10], [1, 20], [2, 20], [3, 30], [2, 40]], dtype=np.uint64)  # 0-1-2-4 via bands; 3 alone
    lab = lsh_components(chain, np.ones(5, bool))
    assert lab[0] == lab[1] == lab[2] == lab[4] != lab[3]
    assert keep_one_per_component(lab, np.array([3, 1, 4, 0, 2])).tolist() == [1, 1, 1, 3, 1]


def test_the_algorithm_is_versioned_in_the_digests_and_the_manifest(tmp_path):
    assert ALGORITHM in INGEST_CODE_VERSION and ALGORITHM in CHUNK_CODE_VERSION
    folder = tmp_path / "src"
    folder.mkdir()
    rng = random.Random(2)
    words = _doc(rng, 400)
    def lines(ws: list[str]) -> str:
        return "".join(" ".join(ws[i:i + 8]) + "\n" for i in range(0, len(ws), 8))

    (folder / "a.py").write_text(lines(words))
    (folder / "b.py").write_text(lines(_edit(rng, words, 2)))
    (folder / "c.py").write_text(lines(_doc(rng, 400)))
    cfg = IngestConfig(sources=[FolderSource(path=str(folder), exclude=[])], decontamination={"enabled": False})
    st = run_ingest(cfg, tmp_path / "out")
    assert st["near_dedup"]["algorithm"] == ALGORITHM and st["near_dedup"]["verified_at"] == pytest.approx(0.65)
    assert st["rejected_by_reason"] == {"near_duplicate": 1}
    assert prepare(cfg).digest == prepare(cfg).digest


def test_signatures_do_not_depend_on_the_thread_count(monkeypatch):
    import codemill.data.minhash as mh

    monkeypatch.setattr(mh, "_MIN_DOCS_PER_THREAD", 1)  # let even a small batch split across threads
    rng = random.Random(4)
    ng = ngram_hashes(pl.Series([" ".join(_doc(rng, rng.randrange(1, 900))) for _ in range(40)]), 5)
    one = signatures(ng, 256, 42, threads=1)
    for threads in (2, 3, 7):
        assert (signatures(ng, 256, 42, threads=threads) == one).all()


def _as_groups(labels: np.ndarray) -> list[set[int]]:
    got: dict[int, set[int]] = {}
    for i, lab in enumerate(labels.tolist()):
        got.setdefault(lab, set()).add(i)
    return sorted(got.values(), key=min)


def test_verified_clustering_is_exactly_the_components_of_verified_candidate_pairs():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 12, size=(80, 3)).astype(np.uint64)  # buckets of ~7: many candidate pairs
    sketches = rng.integers(0, 3, size=(80, 20)).astype(np.uint16)  # agreement ~1/3 on average, spread out
    valid = rng.random(80) > 0.1
    labels = lsh_components(keys, valid, sketches, 0.5)
    want = _brute_components(keys, valid, sketches, 10)
    assert _as_groups(labels) == want
    assert 10 < len(want) < 70 and len(_brute_components(keys, valid)) < len(want)  # verification split groups


def test_verification_checks_every_earlier_bucket_member():
    keys = np.array([[7], [7], [7], [8]], dtype=np.uint64)  # 0, 1, 2 share a bucket
    sk = np.array([[2, 2, 2, 2], [1, 1, 1, 1], [2, 2, 2, 9], [1, 1, 1, 1]], dtype=np.uint16)
    labels = lsh_components(keys, np.ones(4, bool), sk, 0.7)
    assert labels[0] == labels[2] != labels[1]  # 2 matches 0 (3 of 4), not 1 (the newest before it)
    assert len(set(labels.tolist())) == 3  # 3 shares no band; 0 and 1 fail the check
    assert len(set(lsh_components(keys, np.ones(4, bool)).tolist())) == 2  # unverified: one bucket, one group


def test_the_stage_drops_a_verified_near_duplicate_and_keeps_a_band_collision_that_is_not():
    rng = random.Random(3)
    base = _doc(rng, 300)
    texts = [" ".join(base), " ".join(_edit(rng, base, 3)), " ".join(_doc(rng, 300))]
    ng = ngram_hashes(pl.Series(texts), 5)
    sig = signatures(ng, 256, 42)
    keys = band_keys(sig, 25, 10)
    keys[2, 3] = keys[0, 3]  # a forced band collision between unrelated files
    sketches = sketch(sig)
    assert sketches.shape == (3, SKETCH_VALUES) and sketches.dtype == np.uint16
    cands = pl.DataFrame({"rank": [0, 1, 2], "norm_hash": ["a", "b", "c"],
                          "bands": pl.Series(keys, dtype=pl.Array(pl.UInt64, 25)),
                          "sketch": pl.Series(sketches, dtype=pl.Array(pl.UInt16, SKETCH_VALUES)),
                          "lsh_valid": [True] * 3})
    assert resolve_duplicates(cands, near=True, min_similarity=0.65).rows() == [(1, "near_duplicate", 0)]
    assert sorted(resolve_duplicates(cands, near=True).rows()) == [(1, "near_duplicate", 0),
                                                                   (2, "near_duplicate", 0)]
