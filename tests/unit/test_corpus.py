import polars as pl

from codemill.data.corpus import assign_split, build_corpus_table, read_split, split_key, write_shards
from codemill.data.local_source import SourceFile


def _file(path, content, repo="r"):
    import hashlib
    raw = content.encode()
    return SourceFile(repo=repo, path=path, language="python", content=content, bytes=len(raw),
                      sha256=hashlib.sha256(raw).hexdigest())


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


def test_files_of_one_package_share_a_split():
    files = [_file(f"pkg{i % 7}/m{i}.py", f"x = {i}\n") for i in range(70)]
    table, dups = build_corpus_table(files, split_unit="top_level_package", val_fraction=0.5, salt="s")
    assert dups == 0
    per_pkg = table.with_columns(pl.col("path").str.split("/").list.first().alias("pkg")) \
        .group_by("pkg").agg(pl.col("split").n_unique().alias("n"))
    assert per_pkg["n"].max() == 1


def test_exact_dedup_keeps_first_by_sorted_path():
    files = [_file("b.py", "same\n"), _file("a.py", "same\n"), _file("c.py", "other\n")]
    table, dups = build_corpus_table(files, split_unit="repository", val_fraction=0.0, salt="s")
    assert dups == 1 and table["path"].to_list() == ["a.py", "c.py"]


def test_shards_bounded_and_readable(tmp_path):
    files = [_file(f"p/m{i:03d}.py", f"x = {i}\n") for i in range(25)]
    table, _ = build_corpus_table(files, split_unit="repository", val_fraction=0.0, salt="s")
    shards = write_shards(table, tmp_path / "train", "train", max_rows=10)
    assert [s["rows"] for s in shards] == [10, 10, 5]
    back = read_split(tmp_path, "train")
    assert back.equals(table)
    assert read_split(tmp_path, "val").height == 0
