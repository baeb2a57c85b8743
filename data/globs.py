"""Glob patterns over relative POSIX paths with ``**`` (any number of folders), as in .gitignore."""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=256)
def glob_regex(pattern: str) -> re.Pattern[str]:
    i, out = 0, []
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def matches_any(relpath: str, patterns: list[str]) -> bool:
    return any(glob_regex(p).match(relpath) for p in patterns)


def dir_excluded(reldir: str, patterns: list[str]) -> bool:
    """A folder is pruned when everything under it is excluded (``dir/**`` style patterns)."""
    probe = f"{reldir}/\0probe"
    return any(p.endswith("/**") and glob_regex(p).match(probe) for p in patterns)
