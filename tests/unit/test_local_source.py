import os
import shutil
import subprocess

import polars as pl
import pytest

from codemill.data.config import DEFAULT_LANGUAGES
from codemill.data.filters import language_expr
from codemill.data.folder_source import (
    FolderRules,
    SourceNotFoundError,
    decode_source,
    dir_excluded,
    file_extension,
    fingerprint_source,
    git_commit,
    matches_any,
)
from codemill.data.sources import FolderSource, plan_chunks, read_chunk

PY = FolderRules(include=("**/*.py",))


def scan(root, include=("**/*.py",), max_bytes=10**6, **kw):
    cfg = FolderSource(path=str(root), repo="r", include=list(include), exclude=[], **kw)
    specs = plan_chunks(0, cfg, chunk_files=4)
    return pl.concat([read_chunk(s, max_bytes) for s in specs]).sort("path")


@pytest.mark.parametrize(("path", "pattern", "expected"), [
    ("a.py", "**/*.py", True), ("x/y/a.py", "**/*.py", True), ("a.pyc", "**/*.py", False),
    ("test/a.py", "test/**", True), ("x/test/a.py", "test/**", False),
    ("x/__pycache__/a.py", "**/__pycache__/**", True),
])
def test_globs(path, pattern, expected):
    assert matches_any(path, [pattern]) is expected


def test_dir_pruning_only_for_whole_folder_patterns():
    assert dir_excluded("site-packages", ["site-packages/**"])
    assert not dir_excluded("site-packages", ["site-packages/*.py"])


def test_decode_reasons():
    assert decode_source(b"") == (None, "empty")
    assert decode_source(b"  \n\t") == (None, "empty")
    assert decode_source(b"ab\0cd") == (None, "binary")
    assert decode_source(b"caf\xe9 = 1\n") == (None, "invalid_utf8")
    assert decode_source("café = 1\n".encode()) == ("café = 1\n", None)


def test_language_by_extension():
    langs = pl.DataFrame({"path": ["a/b.py", "X.RS", "x.zz"]}).select(
        language_expr(pl.col("path"), DEFAULT_LANGUAGES))["path"].to_list()
    assert langs == ["python", "rust", "unknown"]


@pytest.mark.parametrize("path", ["a/b.py", "X.RS", "x.zz", "Makefile", "a.b/c", ".bashrc", "dir/.py", "x.",
                                  "a..ts", "v1.2/x.Tsx", "ä.PY"])
def test_the_walk_reads_extensions_as_the_language_column_does(path):
    """A folder source without include patterns takes the files ``language_expr`` will name a language."""
    lang = pl.DataFrame({"path": [path]}).select(language_expr(pl.col("path"), DEFAULT_LANGUAGES))["path"][0]
    assert (file_extension(path) in DEFAULT_LANGUAGES) is (lang != "unknown")
    assert DEFAULT_LANGUAGES.get(file_extension(path), "unknown") == lang


def test_missing_root_fails_naming_the_path(tmp_path):
    with pytest.raises(SourceNotFoundError, match=str(tmp_path / "nope")):
        scan(tmp_path / "nope")
    (tmp_path / "f.py").write_text("x")
    with pytest.raises(SourceNotFoundError, match="not a directory"):
        fingerprint_source(tmp_path / "f.py", PY)


def test_scan_counts_rejections_and_keeps_good_files(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "good.py").write_text("def f():\n    return 1\n")
    (tmp_path / "big.py").write_text("x = 1\n" * 100)
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "bin.py").write_bytes(b"\x00\x01\x02")
    (tmp_path / "latin1.py").write_bytes(b"s = '\xe9'\n")
    os.symlink("loop.py", tmp_path / "loop.py")
    os.symlink("missing-target.py", tmp_path / "dangling.py")
    os.symlink(".", tmp_path / "pkg" / "selfdir")
    res = scan(tmp_path, max_bytes=200)
    assert res.filter(pl.col("reason").is_null())["path"].to_list() == ["pkg/good.py"]
    assert dict(res.filter(pl.col("reason").is_not_null()).select("path", "reason").iter_rows()) == {
        "big.py": "too_large", "empty.py": "empty", "bin.py": "binary", "latin1.py": "invalid_utf8",
        "loop.py": "symlink_loop", "dangling.py": "broken_symlink", "pkg/selfdir": "symlinked_dir_not_followed"}
    good = res.filter(pl.col("reason").is_null()).row(0, named=True)
    assert good["repo"] == "r" and good["bytes"] == len(good["content"].encode())


def test_vendored_build_and_virtualenv_folders_are_skipped(tmp_path):
    for d in ("src", "node_modules/x", "build", "third_party/lib", "pkg.egg-info", "env", ".git"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "m.py").write_text("x = 1\n")
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr\n")
    assert scan(tmp_path)["path"].to_list() == ["src/m.py"]
    assert sorted(scan(tmp_path, skip_dirs=[])["path"].to_list()) == [
        "build/m.py", "env/m.py", "node_modules/x/m.py", "pkg.egg-info/m.py", "src/m.py", "third_party/lib/m.py"]


def test_chunks_are_cut_by_path_so_one_new_file_changes_one_chunk(tmp_path):
    for i in range(200):
        (tmp_path / f"m{i:03d}.py").write_text(f"x = {i}\n")
    before = plan_chunks(0, FolderSource(path=str(tmp_path)), chunk_files=8)
    (tmp_path / "m100b.py").write_text("y = 1\n")
    after = plan_chunks(0, FolderSource(path=str(tmp_path)), chunk_files=8)
    assert len(before) > 5
    changed = {c.items for c in after} - {c.items for c in before}
    assert len(changed) == 1 and "m100b.py" in next(iter(changed))


def test_fingerprint_tracks_content_not_mtime(tmp_path):
    f = tmp_path / "a.py"
    f.write_text("x = 1\n")
    d1, n = fingerprint_source(tmp_path, PY)
    os.utime(f, (1, 1))
    assert fingerprint_source(tmp_path, PY)[0] == d1 and n == 1
    f.write_text("x = 2\n")
    assert fingerprint_source(tmp_path, PY)[0] != d1


def test_git_repository_records_commit_and_skips_vcs_dirs(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "proj"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e",
           "PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, env=env)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert git_commit(repo) == head
    assert git_commit(tmp_path) is None
    assert git_commit(repo / "pkg") is None  # inside the work tree, but not its root
    res = scan(repo, include=["**/*"])
    assert res["path"].to_list() == ["pkg/mod.py"]  # nothing from .git/, whatever include says
    assert res["source_commit"].to_list() == [head]


MARKER = "MARKER-7f3a credentials that must never reach the corpus"


def _outside_marker(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text(f"TOKEN = {MARKER!r}\n")
    return outside / "secret.py"


def test_file_link_leading_out_of_the_root_is_refused_unless_allowed(tmp_path):
    secret = _outside_marker(tmp_path)
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "good.py").write_text("x = 1\n")
    os.symlink(secret, root / "abs_link.py")
    os.symlink("../../outside/secret.py", root / "pkg" / "rel_link.py")
    os.symlink("rel_link.py", root / "pkg" / "chained.py")  # inside, but resolves out
    res = scan(root)
    assert dict(res.select("path", "reason").iter_rows()) == {
        "abs_link.py": "symlink_outside_root", "pkg/chained.py": "symlink_outside_root", "pkg/good.py": None,
        "pkg/rel_link.py": "symlink_outside_root"}
    assert not any(MARKER in c for c in res["content"].drop_nulls())
    before = fingerprint_source(root, PY)
    secret.write_text("TOKEN = 'changed'\n")
    assert fingerprint_source(root, PY) == before  # the fingerprint does not read it either
    secret.write_text(f"TOKEN = {MARKER!r}\n")
    allowed = scan(root, follow_external_symlinks=True)
    assert allowed["reason"].null_count() == 4 and allowed.filter(pl.col("path") == "abs_link.py")["content"][0] == \
        f"TOKEN = {MARKER!r}\n"


def test_file_link_into_the_vcs_folder_is_refused(tmp_path):
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "config").write_text('[remote "origin"]\n    url = https://user:ghp_token@github.com/x/y\n')
    os.symlink(".git/config", root / "settings.py")
    assert dict(scan(root).select("path", "reason").iter_rows()) == {"settings.py": "symlink_into_vcs_dir"}


def test_a_path_swapped_for_a_way_out_after_planning_is_checked_when_opened(tmp_path):
    """The walk saw plain files; before the read, one becomes a link out and a folder becomes a link out."""
    secret = _outside_marker(tmp_path)
    root = tmp_path / "repo"
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("a = 1\n")
    (root / "sub" / "secret.py").write_text("b = 2\n")
    specs = plan_chunks(0, FolderSource(path=str(root), repo="r", exclude=[]), chunk_files=4)
    (root / "a.py").unlink()
    os.symlink(secret, root / "a.py")
    (root / "sub").rename(root / "sub-old")
    os.symlink(secret.parent, root / "sub")  # sub/secret.py is a plain file again, but outside the root
    res = pl.concat([read_chunk(s, 10**6) for s in specs]).sort("path")
    assert dict(res.select("path", "reason").iter_rows()) == {"a.py": "symlink_outside_root",
                                                              "sub/secret.py": "symlink_outside_root"}
