from codemill.hashing import (
    canonical_json,
    combine_digests,
    digest_of,
    sha256_bytes,
    sha256_file,
    stage_digest,
)


def test_sha256_matches_known_vector():
    assert sha256_bytes(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_sha256_file_streams_same_as_bytes(tmp_path):
    data = b"x" * (3 * (1 << 20) + 17)
    p = tmp_path / "f"
    p.write_bytes(data)
    assert sha256_file(p) == sha256_bytes(data)


def test_canonical_json_ignores_key_order():
    assert canonical_json({"b": 1, "a": [1, 2]}) == canonical_json({"a": [1, 2], "b": 1})
    assert digest_of({"b": 1, "a": 2}) == digest_of({"a": 2, "b": 1})


def test_stage_digest_changes_with_each_part():
    base = stage_digest("tokenize", "v1", {"vocab": 10}, {"corpus": "aa"})
    assert base == stage_digest("tokenize", "v1", {"vocab": 10}, {"corpus": "aa"})
    assert base != stage_digest("train", "v1", {"vocab": 10}, {"corpus": "aa"})
    assert base != stage_digest("tokenize", "v2", {"vocab": 10}, {"corpus": "aa"})
    assert base != stage_digest("tokenize", "v1", {"vocab": 11}, {"corpus": "aa"})
    assert base != stage_digest("tokenize", "v1", {"vocab": 10}, {"corpus": "ab"})


def test_combine_digests_is_order_independent():
    assert combine_digests([("a", "1"), ("b", "2")]) == combine_digests([("b", "2"), ("a", "1")])
    assert combine_digests([("a", "1"), ("b", "2")]) != combine_digests([("a", "2"), ("b", "1")])
