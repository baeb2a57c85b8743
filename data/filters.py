"""File-level quality filters as Polars expressions over a whole batch (one pass in Rust, no Python loop).

Defaults are The Stack / StarCoder's (bigcode-dataset ``preprocessing/arguments.py``): max line length 1000,
mean line length 100, alphanumeric fraction 0.25; CodeParrot's auto-generated markers in the first 5 lines;
StarCoder2's encoded-data rule (a base64, hex or ``\\u`` run over 1024 characters, or runs covering over half
the file). Minified code is caught by the line-length rules. Each rejected row gets the first reason that
applies, in the order ``FILTER`` declares them.
"""

from __future__ import annotations

import polars as pl

from codemill.config import FilterConfig
from codemill.data.steps import ChunkContext, Step, reject

ENCODED_PATTERNS = (
    r"[A-Za-z0-9+/\n=]{64,}",
    r"(?:\b(?:0x|\\x)?[0-9a-fA-F]{2}(?:,|\b\s*)){8,}",
    r"(?:\\u[0-9a-fA-F]{4}){8,}",
)


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
    head = (pl.col("content").str.split("\n").list.head(cfg.autogen_lines).list.join("\n").str.to_lowercase())
    return df.with_columns(filter_stats(pl.col("content"))).with_columns(filter_reason(cfg, head).alias("reason"))


def _language_step(live: pl.DataFrame, ctx: ChunkContext) -> pl.DataFrame:
    allow = ctx.proc.cfg.allow_languages
    return live.with_columns(reject(~pl.col("language").is_in(allow), "language_not_allowed")) if allow else live


def _filter_step(live: pl.DataFrame, ctx: ChunkContext) -> pl.DataFrame:
    """The statistic columns are dropped again: only the reason is kept."""
    return apply_filters(live, ctx.proc.cfg.filters).select(*live.columns) if live.height else live


LANGUAGE = Step("language", ("language_not_allowed",), _language_step)
FILTER = Step("filter", ("max_line_length", "mean_line_length", "alnum_fraction", "auto_generated", "encoded_data"),
              _filter_step)
