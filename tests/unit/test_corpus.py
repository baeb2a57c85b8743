import polars as pl

from codemill.data.corpus import CORPUS_SCHEMA, ParquetShardWriter, assign_split, read_split, split_key


def _rows(n, size=10, prefix="p/m"):
    return pl.DataFrame({"repo": ["r"] * n, "path": [f"{prefix}{i:03d}.py" for i in range(n)],
                         "language": ["python"] * n, "content": ["x" * size] * n, "bytes": [size] * n,
                         "sha256": [str(i) for i in range(n)], "source_commit": [None] * n,
                         "split": ["train"] * n, "redactions": [0] * n}, schema=CORPUS_SCHEMA)


def test_split_key_by_top_level_package_or_repo():
    assert split_key("r", "json/decoder.py", "top_level_package") == "r/json"
    assert split_key("r", "os.py", "top_level_package") == "r/os"
    assert split_key("r", "json/decoder.py", "repository") == "r"


def test_assign_split_is_deterministic_and_near_fraction():
    keys = [f"repo{i}" for i in range(4000)]
    splits = [assign_split(k, 0.1, "salt") for k in keys]
    assert splits == [assign_split(k, 0.1, "salt") for k in keys]
    frac = splits.count("val") / len(splits)
    assert 0.08 < frac < 0.12
    assert splits != [assign_split(k, 0.1, "other-salt") for k in keys]
    assert set(assign_split(k, 0.0, "s") for k in keys) == {"train"}


def test_shards_bounded_by_rows_and_readable(tmp_path):
    w = ParquetShardWriter(tmp_path / "train", "train", max_rows=10, max_bytes=10**9)
    df = _rows(25)
    w.add(df.slice(0, 7))
    w.add(df.slice(7))
    shards = w.close()
    assert [s["rows"] for s in shards] == [10, 10, 5]
    assert all(len(s["sha256"]) == 64 for s in shards)
    assert read_split(tmp_path, "train").equals(df)
    assert read_split(tmp_path, "val").height == 0


def test_shards_bounded_by_content_bytes(tmp_path):
    w = ParquetShardWriter(tmp_path / "train", "train", max_rows=1000, max_bytes=250)
    w.add(_rows(10, size=100))
    shards = w.close()
    assert [s["rows"] for s in shards] == [2, 2, 2, 2, 2] and max(s["bytes"] for s in shards) <= 250


def test_an_empty_split_still_gets_a_readable_shard(tmp_path):
    shards = ParquetShardWriter(tmp_path / "val", "val", 10, 100).close()
    assert shards[0]["rows"] == 0
    assert pl.read_parquet(tmp_path / shards[0]["file"]).columns == list(CORPUS_SCHEMA)
