"""File-level quality filters as Polars expressions over a whole batch (one pass in Rust, no Python loop).

Defaults are The Stack / StarCoder's (bigcode-dataset ``preprocessing/arguments.py``): max line length 1000,
mean line length 100, alphanumeric fraction 0.25; CodeParrot's auto-generated markers in the first 5 lines;
StarCoder2's encoded-data rule (a base64, hex or ``\\u`` run over 1024 characters, or runs covering over half
the file). Minified code is caught by the line-length rules. Each rejected row gets the first reason that
applies, in the order ``FILTER`` declares them.

``filter_stats`` is the definition of each statistic as a plain Polars expression. The ingest computes the
same values faster (``fast_filter_stats``): counting a regex match per character (the alphanumeric share) and
splitting every file into a list of lines cost more than the rest of the stage, so line lengths, newline
counts and the ASCII part of the alphanumeric count are read off the UTF-8 bytes in one compiled pass
(``_text_stats``), only the non-ASCII characters go through the Unicode regex, and the encoded-data runs are
extracted only from files that the same pass finds a possible run in and one combined ``str.contains`` then
flags (the others have none). Tests hold the two equal, and the pass's pre-filter to a superset.
"""

from __future__ import annotations

import string

import numpy as np
import polars as pl

from codemill.data.config import FilterConfig
from codemill.data.kernels import Kernel, utf8_buffer
from codemill.data.steps import ChunkContext, Step, reject

ENCODED_PATTERNS = (
    r"[A-Za-z0-9+/\n=]{64,}",
    r"(?:\b(?:0x|\\x)?[0-9a-fA-F]{2}(?:,|\b\s*)){8,}",
    r"(?:\\u[0-9a-fA-F]{4}){8,}",
)


# On ASCII text Unicode and ASCII word boundaries agree, and the ASCII one keeps Rust's fast DFA: the hex
# pattern with ``(?-u:\b)`` is the same test on ASCII-only files, at a fraction of the cost.
_HEX_ASCII = ENCODED_PATTERNS[1].replace(r"\b", r"(?-u:\b)")
ENCODED_ANY_ASCII = "|".join((ENCODED_PATTERNS[0], _HEX_ASCII, ENCODED_PATTERNS[2]))
NON_ASCII_ALNUM = r"[\p{L}\p{N}&&[^\x00-\x7F]]"
NON_ASCII_WORD = r"[\w&&[^\x00-\x7F]]"


def language_expr(path: pl.Expr, languages: dict[str, str]) -> pl.Expr:
    """Language from the file extension (lower-cased), 'unknown' when the map has no entry."""
    ext = path.str.extract(r"(\.[^./]+)$", 1).str.to_lowercase()
    return ext.replace_strict(languages, default="unknown", return_dtype=pl.String)


def filter_stats(content: pl.Expr) -> list[pl.Expr]:
    """Per-file statistics the filters test; kept as columns so thresholds can be audited."""
    n_chars = content.str.len_chars()
    lines = content.str.split("\n")
    encoded = pl.concat_list([content.str.extract_all(p).list.eval(pl.element().str.len_chars())
                              for p in ENCODED_PATTERNS])
    return [
        lines.list.eval(pl.element().str.len_chars()).list.max().alias("max_line_length"),
        (n_chars / lines.list.len()).alias("mean_line_length"),
        (content.str.count_matches(r"[\p{L}\p{N}]") / n_chars.clip(lower_bound=1)).alias("alnum_fraction"),
        encoded.list.max().fill_null(0).alias("encoded_max_run"),
        (encoded.list.sum().fill_null(0) / n_chars.clip(lower_bound=1)).alias("encoded_fraction"),
    ]


_ALNUM, _BASE64, _HEX_RUN, _HEX_DIGIT = 1, 2, 4, 8


def _byte_classes() -> np.ndarray:
    """Per byte value, the classes ``_text_stats`` counts: ASCII letters and digits; the base64 pattern's
    class; the characters a hex or ``\\u`` run can hold (hex digits, x, u, backslash, comma, whitespace, and
    any non-ASCII byte, since ``\\s`` is Unicode's); hex digits."""
    alnum = string.ascii_letters + string.digits
    members = {_ALNUM: alnum, _BASE64: alnum + "+/\n=", _HEX_RUN: string.hexdigits + "xu\\, \t\n\v\f\r",
               _HEX_DIGIT: string.hexdigits}
    table = np.zeros(256, dtype=np.uint8)
    for bit, chars in members.items():
        table[[ord(ch) for ch in chars]] |= bit
    table[0x80:] |= _HEX_RUN
    return table


_CLASSES = _byte_classes()
_BASE64_RUN = 64  # ENCODED_PATTERNS[0]'s shortest match
_HEX_UNITS = 7  # the hex pattern's 8 units of 2 digits; the \\u pattern's 8 of 4, the last may run on


@Kernel
def _text_stats(data: np.ndarray, off: np.ndarray, classes: np.ndarray, lines: np.ndarray, longest: np.ndarray,
                alnum: np.ndarray, non_ascii: np.ndarray, suspect: np.ndarray) -> None:  # pragma: no cover
    """Per row, branch-free over its bytes: lines (split on LF), the longest line in characters (UTF-8 lead
    bytes), ASCII letters and digits, whether any byte is non-ASCII, and whether an encoded-data pattern can
    match. A match of the base64 pattern is a run of 64 of its class; one of the hex or ``\\u`` patterns lies
    in a run of hex-run characters holding 7 or more maximal hex-digit runs of length 2 or 4 (its units)."""
    for d in range(len(off) - 1):
        n_lines, best, cur, letters, high = 1, 0, 0, 0, 0
        b64, b64_max, digits, units, units_max = 0, 0, 0, 0, 0
        for i in range(off[d], off[d + 1]):
            c = data[i]
            t = classes[c]
            nl = c == 10
            best = max(best, cur if nl else 0)
            cur = 0 if nl else cur + ((c & 0xC0) != 0x80)
            n_lines += nl
            letters += t & _ALNUM
            high |= c >= 0x80
            b64 = b64 + 1 if t & _BASE64 else 0
            b64_max = max(b64_max, b64)
            hex_digit = (t & _HEX_DIGIT) != 0
            units += (not hex_digit) & ((digits == 2) | (digits == 4))
            units_max = max(units_max, units)
            units = units if t & _HEX_RUN else 0
            digits = digits + 1 if hex_digit else 0
        units_max = max(units_max, units + ((digits == 2) | (digits == 4)))
        lines[d], longest[d], alnum[d], non_ascii[d] = n_lines, max(best, cur), letters, high
        suspect[d] = (b64_max >= _BASE64_RUN) | (units_max >= _HEX_UNITS)


def fast_filter_stats(content: pl.Series) -> pl.DataFrame:
    """The ``filter_stats`` columns, same values and types, for a String Series without nulls (see the module
    docstring)."""
    n = len(content)
    data, off = utf8_buffer(content)
    lines, longest, alnum = np.empty(n, np.uint32), np.empty(n, np.uint32), np.empty(n, np.int64)
    non_ascii, suspect = np.empty(n, np.bool_), np.empty(n, np.bool_)
    _text_stats(data, off, _CLASSES, lines, longest, alnum, non_ascii, suspect)
    frame = pl.DataFrame({"content": content, "non_ascii": non_ascii, "suspect": suspect, "i": np.arange(n)})
    c = pl.col("content")
    wide = frame.filter(pl.col("non_ascii"))
    if wide.height:
        extra = wide.select(c.str.count_matches(NON_ASCII_ALNUM)).to_series().to_numpy()
        alnum[wide["i"].to_numpy()] += extra
    # ``hex_text`` has the content's word boundaries for a Unicode-blind \b: each non-ASCII word character
    # becomes "g" (a word character, not a hex digit); no match of the hex pattern changes or moves
    suspects = frame.filter(pl.col("suspect"))
    hex_text = pl.concat([suspects.filter(~pl.col("non_ascii")).with_columns(c.alias("hex_text")),
                          suspects.filter(pl.col("non_ascii")).with_columns(
                              c.str.replace_all(NON_ASCII_WORD, "g").alias("hex_text"))])
    # "g" can only lengthen base64 runs: a superset of the files with a run
    flagged = hex_text.filter(pl.col("hex_text").str.contains(ENCODED_ANY_ASCII))
    run_max = np.zeros(n, np.uint32)
    run_sum = np.zeros(n, np.int64)
    if flagged.height:
        pairs = ((c, ENCODED_PATTERNS[0]), (pl.col("hex_text"), _HEX_ASCII), (c, ENCODED_PATTERNS[2]))
        runs = flagged.select(pl.concat_list([t.str.extract_all(p).list.eval(pl.element().str.len_chars())
                                              for t, p in pairs]).alias("runs"))["runs"]
        rows = flagged["i"].to_numpy()
        run_max[rows] = runs.list.max().fill_null(0).to_numpy()
        run_sum[rows] = runs.list.sum().fill_null(0).to_numpy()
    n_chars = content.str.len_chars()
    stats = pl.DataFrame({"n": n_chars, "lines": pl.Series(lines, dtype=pl.UInt32),
                          "max_line_length": pl.Series(longest, dtype=pl.UInt32),
                          "alnum": pl.Series(alnum, dtype=pl.UInt32),
                          "encoded_max_run": pl.Series(run_max, dtype=pl.UInt32),
                          "run_sum": pl.Series(run_sum, dtype=pl.UInt32)})
    return stats.select(
        "max_line_length",
        (pl.col("n") / pl.col("lines")).alias("mean_line_length"),
        (pl.col("alnum") / pl.col("n").clip(lower_bound=1)).alias("alnum_fraction"),
        "encoded_max_run",
        (pl.col("run_sum") / pl.col("n").clip(lower_bound=1)).alias("encoded_fraction"),
    )


def head_lines(content: pl.Expr, lines: int) -> pl.Expr:
    """The first ``lines`` lines, lower-cased: ``split("\\n").head(lines).join("\\n")`` without the split."""
    return content.str.extract(rf"\A((?:[^\n]*\n){{0,{lines - 1}}}[^\n]*)", 1).str.to_lowercase()


def filter_reason(cfg: FilterConfig, head: pl.Expr) -> pl.Expr:
    """The first failing filter's name, or null. Expects the ``filter_stats`` columns to exist."""
    autogen = pl.lit(False)
    for marker in cfg.autogen_markers:
        autogen = autogen | head.str.contains(marker.lower(), literal=True)
    return (
        pl.when(pl.col("max_line_length") > cfg.max_line_length).then(pl.lit("max_line_length"))
        .when(pl.col("mean_line_length") > cfg.max_mean_line_length).then(pl.lit("mean_line_length"))
        .when(pl.col("alnum_fraction") < cfg.min_alnum_fraction).then(pl.lit("alnum_fraction"))
        .when(autogen).then(pl.lit("auto_generated"))
        .when((pl.col("encoded_max_run") > cfg.encoded_max_match)
              | (pl.col("encoded_fraction") > cfg.encoded_max_fraction)).then(pl.lit("encoded_data"))
        .otherwise(pl.lit(None, dtype=pl.String))
    )


def apply_filters(df: pl.DataFrame, cfg: FilterConfig) -> pl.DataFrame:
    """Adds the statistic columns and ``reason`` (null = kept) to a frame with a ``content`` column."""
    head = head_lines(pl.col("content"), cfg.autogen_lines)
    fast = df.height and not df["content"].has_nulls()
    stats = fast_filter_stats(df["content"]) if fast else df.select(filter_stats(pl.col("content")))
    return df.with_columns(stats).with_columns(filter_reason(cfg, head).alias("reason"))


def _language_step(live: pl.DataFrame, ctx: ChunkContext) -> pl.DataFrame:
    allow = ctx.proc.cfg.allow_languages
    return live.with_columns(reject(~pl.col("language").is_in(allow), "language_not_allowed")) if allow else live


def _filter_step(live: pl.DataFrame, ctx: ChunkContext) -> pl.DataFrame:
    """The statistic columns are dropped again: only the reason is kept."""
    return apply_filters(live, ctx.proc.cfg.filters).select(*live.columns) if live.height else live


LANGUAGE = Step("language", ("language_not_allowed",), _language_step)
FILTER = Step("filter", ("max_line_length", "mean_line_length", "alnum_fraction", "auto_generated", "encoded_data"),
              _filter_step)
