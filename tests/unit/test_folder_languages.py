"""A folder source takes every language the ingest knows, and every file of a repository is accounted for: in
the corpus with its language, rejected with a reason in ``files.parquet``, or left out by the walk with a
reason. ``codemill plan`` counts the same files by language before anything runs."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from codemill.cli import app
from codemill.data.config import DEFAULT_LANGUAGES, IngestConfig, source_config
from codemill.data.corpus import read_split
from codemill.data.folder_source import Rejections, iter_candidates
from codemill.data.ingest import run_ingest
from codemill.data.sources import FolderSource, folder_root, folder_rules
from codemill.data.sources.folder import STDLIB_EXCLUDES, STDLIB_INCLUDE
from codemill.data.survey import SourceSurvey, survey_lines, survey_source

MINIFIED = "var a=" + ";var ".join(f"x{i}={i}" for i in range(400)) + ";\n"
FILES = {
    "src/app/main.py": 'def main():\n    """Greet."""\n    return "hello"\n',
    "src/app/util.py": "def double(x):\n    return 2 * x\n",
    "test/test_main.py": 'from app.main import main\n\n\ndef test_main():\n    assert main() == "hello"\n',
    "web/src/greet.ts": "export function greet(name: string): string {\n  return `hi ${name}`;\n}\n",
    "crates/core/src/lib.rs": "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n",
    "cmd/tool/main.go": 'package main\n\nfunc main() {\n\tprintln("tool")\n}\n',
    "README.md": "# Mixed\n\nA repository in four languages.\n",
    "web/app.min.js": MINIFIED,
    "package-lock.json": '{"name": "web", "lockfileVersion": 3}\n',
    "Cargo.lock": '[[package]]\nname = "core"\nversion = "0.1.0"\n',
    "LICENSE": "MIT License\n",
    "vendor/lib/v.py": "def vendored():\n    return 1\n",
    "node_modules/left-pad/index.js": "module.exports = function pad(s) { return s; };\n",
    "target/debug/build.rs": "fn main() {}\n",
}
IN_CORPUS = {"src/app/main.py": "python", "src/app/util.py": "python", "test/test_main.py": "python",
             "web/src/greet.ts": "typescript", "crates/core/src/lib.rs": "rust", "cmd/tool/main.go": "go",
             "README.md": "markdown"}


def mixed_repo(root: Path) -> Path:
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0")
    return root


def all_files(root: Path) -> set[str]:
    return {Path(d, f).relative_to(root).as_posix() for d, _, fs in os.walk(root) for f in fs}


def test_a_mixed_repository_is_ingested_by_language_and_every_file_is_accounted_for(tmp_path):
    repo = mixed_repo(tmp_path / "myrepo")
    cfg = IngestConfig(sources=[FolderSource(path=str(repo))], val_fraction=0.0)
    out = tmp_path / "out"
    run_ingest(cfg, out)
    corpus = read_split(out, "train")
    assert dict(corpus.select("path", "language").iter_rows()) == IN_CORPUS
    rejected = dict(pl.read_parquet(out / "files.parquet").filter(pl.col("reason").is_not_null())
                    .select("path", "reason").iter_rows())
    assert rejected == {"web/app.min.js": "max_line_length"}  # minified: rejected by the filter, with its reason
    left_out = Rejections()
    list(iter_candidates(Path(folder_root(cfg.sources[0])), folder_rules(cfg.sources[0], cfg.languages),
                         passed_over=left_out))
    walk = dict(left_out.entries)
    assert walk == {"Cargo.lock": "excluded", "package-lock.json": "excluded", "LICENSE": "not_included",
                    "logo.png": "not_included", "node_modules": "skipped_dir", "target": "skipped_dir",
                    "vendor": "skipped_dir"}

    def reason(rel: str) -> str | None:
        folders = [rel.rsplit("/", i)[0] for i in range(1, rel.count("/") + 1)]
        return rejected.get(rel) or walk.get(rel) or next((walk[f] for f in folders if f in walk), None)

    unaccounted = {rel for rel in all_files(repo) if rel not in IN_CORPUS and reason(rel) is None}
    assert not unaccounted


def test_the_stdlib_source_keeps_its_own_defaults_and_a_named_folder_takes_every_language():
    stdlib = FolderSource()
    assert (stdlib.include, stdlib.exclude) == (STDLIB_INCLUDE, STDLIB_EXCLUDES)
    assert source_config(**stdlib.model_dump()).digest_config() == stdlib.digest_config()
    assert FolderSource(exclude=[]).exclude == [] and FolderSource(include=["**/*.pyi"]).include == ["**/*.pyi"]
    named = FolderSource(path="~/src/myrepo")
    assert named.include is None and "test/**" not in named.exclude
    assert folder_rules(named, DEFAULT_LANGUAGES).includes("web/src/greet.ts")
    assert not folder_rules(stdlib, DEFAULT_LANGUAGES).includes("web/src/greet.ts")


def test_plan_counts_the_files_by_language_as_the_ingest_will_read_them(tmp_path):
    repo = mixed_repo(tmp_path / "myrepo")
    survey = survey_source(FolderSource(path=str(repo)), DEFAULT_LANGUAGES)
    assert survey.files == 8
    assert survey.languages == (("python", 3), ("go", 1), ("javascript", 1), ("markdown", 1), ("rust", 1),
                                ("typescript", 1))
    assert dict(survey.passed_over) == {"skipped_dir": 3, "excluded": 2, "not_included": 2}
    assert survey_lines(survey)[-1] == ("    left out: 3 folders in skip_dirs, 2 files excluded, "
                                        "2 files with no language")
    python_only = survey_source(FolderSource(path=str(repo), include=["**/*.py"]), DEFAULT_LANGUAGES)
    assert python_only.languages == (("python", 3),) and "not in include" in survey_lines(python_only)[-1]
    result = CliRunner().invoke(app, ["plan", "--source", str(repo), "--store", str(tmp_path / "store"),
                                      "--until", "ingest"])
    assert result.exit_code == 0, result.output
    printed = " ".join(result.output.split())  # the source line may wrap its languages onto the next line
    assert "myrepo: 8 files python 3, go 1, javascript 1, markdown 1, rust 1, typescript 1 left out:" in \
        printed.replace("files:", "files")


@pytest.mark.parametrize("width", [80, 60])
def test_survey_lines_fit_the_width(width):
    many = tuple((f"language{i}", 1000 - i) for i in range(30))
    survey = SourceSurvey("/home/someone/" + "deeply/nested/" * 8 + "repo", "folder", 29_535, many,
                          (("skipped_dir", 12), ("excluded_dir", 1), ("excluded", 40), ("not_included", 512)))
    lines = survey_lines(survey, width)
    assert all(len(line) <= width for line in lines)
    assert lines[0].startswith("  source ...") and lines[0].endswith("/repo: 29535 files")
    assert lines[1].startswith("    language0 1000, ") and lines[1].endswith("more")
    assert "512 files with no language" in " ".join(lines[2:])
    short = survey_lines(SourceSurvey("~/src/myrepo", "folder", 412, (("python", 300), ("typescript", 80),
                                                                      ("rust", 32))))
    assert short == ["  source ~/src/myrepo: 412 files: python 300, typescript 80, rust 32"]
    assert survey_lines(SourceSurvey("s3://bucket/code/*.parquet", "parquet")) == [
        "  source s3://bucket/code/*.parquet: parquet, languages are known once read"]
