"""Text that fits a terminal: metric values with significant digits, free text wrapped at a width, and tables
of plain aligned columns that take the widest form that fits.

No row of a table is ever wrapped or cut: a table offers forms from the most to the least detailed (a path
relative to the store, then the 12-hex digest the store's folder names end in) and the first whose every line
fits is printed. 80 columns is the width a log is read at; a terminal's own width is used when it is wider.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

LOG_WIDTH = 80
GAP = 2  # spaces between two columns
DIGEST_CHARS = 12  # what the store's folder names carry of a digest


def num(x: float) -> str:
    """A metric value: four decimals, or three significant figures where four decimals would hide them
    (0.000012 is ``1.2e-05``, not ``0.0000``); zero is ``0``."""
    if x == 0:
        return "0"
    return f"{x:.3g}" if abs(x) < 0.01 else f"{x:.4f}"  # nan and inf compare False: "nan", "inf"


def signed(x: float) -> str:
    """``num`` with its sign: a difference (none is ``0``)."""
    return num(x) if x <= 0 else f"+{num(x)}"


def ci(low: float, high: float) -> str:
    """A confidence interval as ``low - high``."""
    return f"{num(low)} - {num(high)}"


def wrap(text: str, width: int = LOG_WIDTH, indent: str = "  ") -> list[str]:
    """Free text at ``width``, continuation lines indented; a word (a path, a URL) is split only where it is
    longer than a whole line."""
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def fits(lines: Iterable[str], width: int) -> bool:
    return all(len(line) <= width for line in lines)


@dataclass(frozen=True)
class Column:
    head: str
    align: Literal["<", ">"] = "<"


def table(columns: Sequence[Column], rows: Iterable[Sequence[str]], indent: str = "") -> list[str]:
    """A heading line and one line per row, each column as wide as its widest cell, two spaces apart."""
    body = [list(r) for r in rows]
    widths = [max([len(c.head), *(len(r[i]) for r in body)]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return (indent + (" " * GAP).join(f"{cell:{c.align}{w}}" for cell, c, w in zip(cells, columns, widths,
                                                                                     strict=True))).rstrip()

    return [line([c.head for c in columns]), *(line(r) for r in body)]


def first_fitting(forms: Iterable[Callable[[], list[str]]], width: int) -> list[str]:
    """The first form whose every line fits ``width``; the last one when none does."""
    lines: list[str] = []
    for form in forms:
        lines = form()
        if fits(lines, width):
            return lines
    return lines


def table_in_parts(key: Column, columns: Sequence[Column], rows: Sequence[tuple[str, Sequence[str]]],
                   width: int) -> list[str]:
    """A table too wide for ``width`` as several tables one under the other, each with the key column and as
    many of the other columns as fit (never fewer than one)."""
    parts: list[list[int]] = [[]]
    for i in range(len(columns)):
        trial = parts[-1] + [i]
        if parts[-1] and not fits(_part(key, columns, rows, trial), width):
            parts.append([i])
        else:
            parts[-1] = trial
    out: list[str] = []
    for n, part in enumerate(parts):
        out += ([""] if n else []) + _part(key, columns, rows, part)
    return out


def _part(key: Column, columns: Sequence[Column], rows: Sequence[tuple[str, Sequence[str]]],
          part: Sequence[int]) -> list[str]:
    return table([key, *(columns[i] for i in part)], [(k, *(cells[i] for i in part)) for k, cells in rows])


def relative_to(uri: str, root: str) -> str:
    """``uri`` as a path under ``root`` (the store root, printed once), or unchanged when it is elsewhere."""
    prefix = root.rstrip("/") + "/"
    return uri[len(prefix):] if root and uri.startswith(prefix) else uri
