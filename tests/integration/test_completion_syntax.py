"""The completion_syntax suite: a generated line is scored by whether the file still parses with it in place of
the held-out line, on Python val files that parse, with a real (untrained) model generating."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import polars as pl
import pytest

from codemill.evals import suites
from codemill.evals.completion import pick_line
from codemill.evals.config import EvalConfig
from codemill.evals.suites.base import SuiteRun
from codemill.evals.suites.completion_syntax import parses, syntax_items, with_line

STDLIB = Path(sysconfig.get_paths()["stdlib"])
MODULES = ("textwrap.py", "colorsys.py", "bisect.py", "keyword.py", "json/__init__.py", "json/decoder.py")


def test_a_line_that_breaks_the_file_is_a_miss_and_the_held_out_line_is_not():
    text = "def f(x):\n    y = x + 1\n    return y\n"
    assert parses(text)
    assert parses(with_line(text, 1, "y = x * 2"))  # at the line's own indentation
    assert not parses(with_line(text, 1, "y = (x + 1"))
    assert not parses(with_line(text, 2, "return y if"))
    assert not parses("(" * 5000)  # too deep for the parser: a miss, not a crash


def test_items_are_python_files_that_parse():
    files = [("r/ok.py", "r", "import os\nvalue = os.sep\nprint(value)\n"),
             ("r/broken.py", "r", "def f(:\n    return 1\n    pass\n"),
             ("r/app.js", "r", "const a = 1;\nconst b = a + 1;\nconsole.log(b);\n")]
    items = syntax_items(files, seed=0)
    assert [it.item_id for it, _ in items] == ["r/ok.py"]
    item, text = items[0]
    assert text.split("\n")[item.line].strip() == item.target


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    (root / "val").mkdir()
    rows = [{"repo": "stdlib", "path": m, "content": (STDLIB / m).read_text()} for m in MODULES]
    pl.DataFrame(rows).write_parquet(root / "val" / "part-0.parquet")
    return root


def test_the_suite_scores_each_generated_line_by_the_parse(corpus, tmp_path):
    from tests.tiny_policy import make_policy

    policy = make_policy(tmp_path / "policy")
    cfg = EvalConfig.model_validate({"completion_syntax": {"max_new_tokens": 12, "context_len": 128},
                                     "bootstrap_samples": 100})
    rows, summary = suites.get("completion_syntax").run(SuiteRun(cfg, policy, tmp_path.joinpath, corpus_dir=corpus))
    texts = {f"stdlib/{m}": (STDLIB / m).read_text() for m in MODULES}
    assert rows.height == summary["items"] == len(MODULES)
    for row in rows.iter_rows(named=True):
        lines = texts[row["item_id"]].split("\n")
        index = pick_line(row["item_id"], lines, cfg.seed)
        assert index is not None and lines[index].strip() == row["target"]
        assert row["valid"] == float(parses(with_line(texts[row["item_id"]], index, row["prediction"])))
        assert parses(with_line(texts[row["item_id"]], index, row["target"]))  # the held-out line itself is valid
    assert summary["completion_syntax_valid"] == pytest.approx(rows["valid"].mean())
    scores = suites.item_scores("completion_syntax", rows)["completion_syntax_valid"]
    assert scores.binary and list(scores.values) == rows["valid"].to_list()
