"""Does the completed line leave the file valid Python? Next-line completion on the val split's Python files,
scored by whether the file still parses with the model's line in place of the held-out one.

Edit similarity rewards a line that looks like the target; an editor needs a line that does not break the file.
A small model's completions often close a bracket that was never opened, start a block and never indent it, or
stop mid-string: each is a line the user has to delete. The items are the completion suite's (one seeded line per
val file, ``evaluate.completion_syntax.max_files`` files); only Python files whose original text parses count, so
every miss is the model's. The parse is ``ast.parse`` on text the model wrote: it runs no code, and a file the
parser cannot take (too deeply nested, too large) is a miss.
"""

from __future__ import annotations

import ast
import warnings

import numpy as np
import polars as pl
from pydantic import Field

from codemill.evals import completion as comp
from codemill.evals.stats import ItemScores
from codemill.evals.suites.base import Metric, Rows, Suite, SuiteRun, ci, scores
from codemill.evals.suites.completion import val_files
from codemill.stage_config import StageConfig, runtime_only

CODE_VERSION = "completion-syntax-v1"
PYTHON_SUFFIXES = (".py", ".pyi")


class CompletionSyntaxSuiteConfig(StageConfig):
    """Whether a generated line keeps the file parseable (Python val files)."""

    max_files: int | None = Field(200, description="Val files read (sorted by path); the Python ones whose text "
                                  "parses each give one item.")
    context_len: int = Field(256, ge=16, description="Prompt tokens kept (left-truncated) plus new tokens.")
    max_new_tokens: int = Field(32, gt=0, description="Most tokens generated per item (generation also stops at "
                                                      "the end of the line).")
    batch_size: int = runtime_only(default=16, gt=0, description="Prompts per generation batch.")


VALID = Metric("completion_syntax_valid", binary=True)


def parses(text: str) -> bool:
    """Whether ``text`` is a Python module the parser accepts (no code runs)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences and the like are warnings, not errors
            ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def with_line(content: str, index: int, line: str) -> str:
    """``content`` with line ``index`` replaced by ``line`` at that line's indentation."""
    lines = content.split("\n")
    old = lines[index]
    lines[index] = old[: len(old) - len(old.lstrip())] + line.strip()
    return "\n".join(lines)


def syntax_items(files: list[tuple[str, str, str]], seed: int) -> list[tuple[comp.CompletionItem, str]]:
    """(item, file text) for every Python file that parses and has a line to complete: the completion suite's
    item of that file."""
    python = [f for f in files if f[0].endswith(PYTHON_SUFFIXES) and parses(f[2])]
    text = {item_id: content for item_id, _, content in python}
    return [(item, text[item.item_id]) for item in comp.make_items(python, seed)]


def run(r: SuiteRun) -> Rows:
    from codemill.models.engines import RolloutParams

    cfg = r.cfg
    sc = cfg.completion_syntax
    items = syntax_items(val_files(r, sc.max_files), cfg.seed)
    if not items:
        raise ValueError("no completion_syntax items: no val file is Python that parses with a line to complete")
    greedy = RolloutParams(temperature=0, max_new_tokens=sc.max_new_tokens, stop=("\n",))
    with r.model.engine(sc.batch_size, sc.context_len) as engine:
        done = engine.generate([it.prefix for it, _ in items], 1, greedy, [0] * len(items))
    preds = [cs[0].text for cs in done]
    valid = np.array([float(parses(with_line(text, it.line, p))) for p, (it, text) in zip(preds, items, strict=True)])
    rows = pl.DataFrame({"item_id": [it.item_id for it, _ in items], "cluster": [it.cluster for it, _ in items],
                         "target": [it.target for it, _ in items], "prediction": [p.strip() for p in preds],
                         "valid": valid})
    summary = {**ci(valid, np.ones(len(items)), rows["cluster"].to_numpy(), cfg, VALID.name), "items": len(items)}
    return rows, summary


def item_scores(rows: pl.DataFrame) -> dict[str, ItemScores]:
    return {VALID.name: scores(rows, VALID, "valid")}


SUITE = Suite("completion_syntax", CODE_VERSION, run, item_scores, (VALID,), generates=True,
              settings=CompletionSyntaxSuiteConfig, default=False)
