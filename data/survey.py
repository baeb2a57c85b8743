"""What each source holds, seen before anything runs: the files a folder source's walk takes, by language, and
what the walk passes over and why.

The walk is the ingest's own (``iter_candidates`` under the source's ``folder_rules``) and each file's language
comes from ``language_expr``, the expression the ingest names languages with, so the counts are the files the
ingest will read. Only names are listed: no file is opened. ``codemill plan`` prints ``survey_lines``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from codemill.data.filters import language_expr
from codemill.data.folder_source import Rejections, iter_candidates
from codemill.data.sources import CorpusSource, FolderSource

INDENT = "  "


@dataclass(frozen=True)
class SourceSurvey:
    """One source: where it is, how many files the walk takes (None: known once read) and their languages,
    most files first, and the walk's passed-over entries counted by reason (``WALK_REASONS``)."""

    label: str
    kind: str
    files: int | None = None
    languages: tuple[tuple[str, int], ...] = ()
    passed_over: tuple[tuple[str, int], ...] = ()
    by_include: bool = False  # the walk takes what include patterns match, not what has a language


def shown_as(src: CorpusSource) -> str:
    """The source as a user wrote it, the home folder shown as ``~``; the stdlib source as ``stdlib``."""
    if src.is_stdlib:
        return "stdlib"
    text = str(src.path)
    home = os.path.expanduser("~")
    if isinstance(src, FolderSource) and text.startswith(home + os.sep):
        text = "~" + text[len(home):]
    return text


def survey_source(src: CorpusSource, languages: Mapping[str, str]) -> SourceSurvey:
    """Walk a folder source as the ingest will; other kinds are only read by the ingest, so say just that."""
    if not isinstance(src, FolderSource):
        return SourceSurvey(shown_as(src), src.kind)
    passed = Rejections()
    paths = list(iter_candidates(Path(src.root()), src.rules(languages), passed_over=passed))
    named = pl.DataFrame({"path": paths}, schema={"path": pl.String}).select(
        language_expr(pl.col("path"), dict(languages)).alias("language"))
    counts = Counter(named["language"].to_list())
    return SourceSurvey(shown_as(src), src.kind, len(paths), _ranked(counts),
                        _ranked(Counter(reason for _, reason in passed.entries)), bool(src.include))


def _ranked(counts: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def fit(items: Sequence[str], width: int) -> str:
    """``items`` joined by commas within ``width`` characters: as many as fit, then ``+N more``."""
    for shown in range(len(items), -1, -1):
        rest = len(items) - shown
        text = ", ".join([*items[:shown], *([f"+{rest} more"] if rest else [])])
        if len(text) <= width:
            return text
    return f"+{len(items)} more"[:width]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def wrap(items: Sequence[str], first: str, indent: str, width: int) -> list[str]:
    """``items`` joined by commas after ``first``, wrapped onto lines that start with ``indent``; an item
    longer than a line is cut to it."""
    lines, cur, fresh = [], first, True
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if not fresh and len(cur) + 1 + len(piece) > width:
            lines.append(cur)
            cur, fresh = indent, True
        cur += piece if fresh else " " + piece
        fresh = False
    lines.append(cur)
    return [line[:width] for line in lines]


def _passed_over_items(survey: SourceSurvey) -> list[str]:
    """``2 folders in skip_dirs``, ``1 file excluded``, ``5 files with no language``."""
    why = {"skipped_dir": "in skip_dirs", "excluded_dir": "excluded", "excluded": "excluded",
           "not_included": "not in include" if survey.by_include else "with no language"}
    return [f"{_plural(n, 'folder' if reason.endswith('_dir') else 'file')} {why[reason]}"
            for reason, n in survey.passed_over]


def survey_lines(survey: SourceSurvey, width: int = 80) -> list[str]:
    """The survey as lines of at most ``width`` columns: ``source <where>: N files: python 300, rust 32``,
    the languages on a line of their own when they do not fit beside it, then what the walk passed over."""
    if survey.files is None:
        tail = f": {survey.kind}, languages are known once read"
    else:
        tail = f": {_plural(survey.files, 'file')}"
    head = f"{INDENT}source "
    room = width - len(head) - len(tail)
    label = survey.label if len(survey.label) <= room else "..." + survey.label[len(survey.label) - max(room - 3, 0):]
    first = f"{head}{label}{tail}"[:width]
    if survey.files is None:
        return [first]
    langs = [f"{name} {n}" for name, n in survey.languages]
    if langs and len(first) + 2 + len(", ".join(langs)) <= width:
        lines = [f"{first}: {', '.join(langs)}"]
    else:
        lines = [first] + ([f"{INDENT * 2}{fit(langs, width - 2 * len(INDENT))}"] if langs else [])
    passed = _passed_over_items(survey)
    if passed:
        lines += wrap(passed, f"{INDENT * 2}left out: ", INDENT * 3, width)
    return lines
