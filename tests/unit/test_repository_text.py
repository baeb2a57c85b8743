"""The repository speaks of the product as it is: no text in it (code, docstrings, comments, tests, docs) cites
issue numbers, how the work was organised, or files outside the repository; history lives in CHANGELOG.md.
The README stays a short entry, and the docs hold the rest."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".json", ".cfg", ".ini", ""}
FORBIDDEN = re.compile(r"\bissue[ -]#?\d+|\.\./shared\b|shared/notes|\b(this|previous|earlier) session\b",
                       re.IGNORECASE)
HISTORY_FILES = {"CHANGELOG.md"}
README_MAX_LINES = 200


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split("\0")
    files = [ROOT / n for n in names if n and Path(n).suffix in TEXT_SUFFIXES and n not in HISTORY_FILES]
    return [f for f in files if f.is_file() and not f.is_symlink()]


def test_no_text_cites_issues_sessions_or_outside_paths():
    this = Path(__file__).resolve()
    hits = []
    for path in tracked_text_files():
        if path.resolve() == this:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert tracked_text_files(), "git ls-files found nothing: not a checkout?"
    assert not hits, "\n".join(hits)


def test_the_pattern_catches_what_it_must():
    for bad in ("see issue 14 contract", "../shared/notes/rl.md", "Issue-12 numbers", "in this session"):
        assert FORBIDDEN.search(bad), bad
    for fine in ("an issue with the server", "sessions of bwrap (--new-session)", "shared memory"):
        assert not FORBIDDEN.search(fine), fine


def test_the_readme_is_a_short_entry_that_links_into_the_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), f"README links to a missing page: {link}"
    assert "python -m pytest -q" in readme and "codemill run" in readme
