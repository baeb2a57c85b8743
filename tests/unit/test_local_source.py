import os

import pytest

from codemill.data.globs import dir_excluded, matches_any
from codemill.data.local_source import (
    SourceNotFoundError,
    decode_source,
    fingerprint_source,
    language_of,
    scan_source,
)


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
    assert language_of("a/b.py") == "python" and language_of("x.rs") == "rust" and language_of("x.zz") == "unknown"


def test_missing_root_fails_naming_the_path(tmp_path):
    with pytest.raises(SourceNotFoundError, match=str(tmp_path / "nope")):
        scan_source(tmp_path / "nope", "r", ["**/*.py"], [], 1000)
    (tmp_path / "f.py").write_text("x")
    with pytest.raises(SourceNotFoundError, match="not a directory"):
        fingerprint_source(tmp_path / "f.py", ["**/*.py"], [])


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
    res = scan_source(tmp_path, "r", ["**/*.py"], [], max_bytes=200)
    assert [f.path for f in res.files] == ["pkg/good.py"]
    assert dict(res.rejected) == {"too_large": 1, "empty": 1, "binary": 1, "invalid_utf8": 1,
                                  "symlink_loop": 1, "broken_symlink": 1, "symlinked_dir_not_followed": 1}
    good = res.files[0]
    assert good.repo == "r" and good.language == "python" and good.bytes == len(good.content.encode())


def test_fingerprint_tracks_content_not_mtime(tmp_path):
    f = tmp_path / "a.py"
    f.write_text("x = 1\n")
    d1, n = fingerprint_source(tmp_path, ["**/*.py"], [])
    os.utime(f, (1, 1))
    assert fingerprint_source(tmp_path, ["**/*.py"], [])[0] == d1 and n == 1
    f.write_text("x = 2\n")
    assert fingerprint_source(tmp_path, ["**/*.py"], [])[0] != d1


def test_git_repository_records_commit_and_skips_vcs_dirs(tmp_path):
    import shutil
    import subprocess

    from codemill.data.local_source import git_commit

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
    res = scan_source(repo, "proj", ["**/*"], [], max_bytes=10**6, commit=git_commit(repo))
    assert [f.path for f in res.files] == ["pkg/mod.py"]  # nothing from .git/, whatever include says
    assert res.files[0].source_commit == head
