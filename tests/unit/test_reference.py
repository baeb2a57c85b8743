"""The generated reference pages leave nothing out: every config field with its description, every command.

The config is walked here on its own (not with ``codemill.reference``'s walker), so a field the reference's walk
skips fails the test instead of vanishing from both."""

from __future__ import annotations

import importlib.util
import re
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
import typer
from pydantic import BaseModel

from codemill.cli import app
from codemill.config import PipelineConfig
from codemill.reference import cli_reference, config_reference

ROOT = Path(__file__).resolve().parents[2]


def _models(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """(path suffix, model) for each config model a field holds: itself, its list items, its union members (a
    discriminated union of list items is ``Annotated``)."""
    if get_origin(annotation) is Annotated:
        return _models(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for a in get_args(annotation) if a is not type(None) for m in _models(a)]
    if get_origin(annotation) is list:
        return [("[]" + suffix, m) for suffix, m in _models(get_args(annotation)[0])]
    if get_origin(annotation) is dict:
        return [("[<key>]" + suffix, m) for suffix, m in _models(get_args(annotation)[1])]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    return []


def leaf_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str | None]]:
    """(dotted path, description) of every field that holds a value rather than another config section."""
    out: list[tuple[str, str | None]] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        nested = _models(info.annotation)
        if nested:
            for suffix, m in nested:
                out += leaf_fields(m, path + suffix)
        else:
            out.append((path, info.description))
    return out


def _unescape(markdown: str) -> str:
    """A rendered table row as plain text: markdown escapes and HTML entities undone."""
    text = re.sub(r"\\([\\`*_{}\[\]()#+\-.!|<>])", r"\1", markdown)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


@pytest.fixture(scope="module")
def config_md() -> str:
    return config_reference()


@pytest.fixture(scope="module")
def cli_md() -> str:
    return cli_reference()


def test_the_walk_sees_the_whole_config():
    paths = {p for p, _ in leaf_fields(PipelineConfig)}
    # one field from each corner: a list item, an optional section, a nested list item, two places of one model
    for p in ("ingest.sources[].kind", "train.lora.r", "ingest.decontamination.eval_sets[].id_field",
              "rl.algorithm.epochs", "rl.warm_start.epochs", "gate.metrics[].uncalibrated_margin",
              "problems.sources[].split_by", "rl.algorithm.clip_high", "rl.env.max_turns", "name"):
        assert p in paths, p
    assert len(paths) > 150


def test_every_config_field_appears_with_its_description(config_md):
    rows: dict[str, list[str]] = {}  # a path can have one row per form of a union (rl.algorithm.lr: grpo, rft)
    for line in config_md.splitlines():
        if m := re.match(r"\| `([^`]+)` \|", line):
            rows.setdefault(m.group(1), []).append(line)
    missing, undescribed = [], []
    for path, description in leaf_fields(PipelineConfig):
        found = rows.get(path)
        if found is None:
            missing.append(path)
        elif description and not any(" ".join(description.split()) in _unescape(row) for row in found):
            undescribed.append(path)
    assert not missing, f"fields missing from the config reference: {missing}"
    assert not undescribed, f"fields whose description is missing from their row: {undescribed}"


def test_config_defaults_are_the_ones_at_that_place(config_md):
    """rl.algorithm (rft) and rl.warm_start share a model but not defaults; the rows show each one's own."""
    assert re.search(r"^\| `rl\.algorithm\.epochs` \|.*\| `2\.0` \|", config_md, re.M)
    assert re.search(r"^\| `rl\.warm_start\.max_steps` \|.*\| `0` \|", config_md, re.M)
    assert re.search(r"^\| `train\.max_steps` \|.*\| `200` \|", config_md, re.M)
    assert '{"name": "val_bpb", "margin": 0.01}' in config_md  # a long default, printed below its table


def test_every_command_appears_with_its_options(cli_md):
    group: Any = typer.main.get_command(app)
    ctx = group.context_class(group, info_name="codemill")
    names = group.list_commands(ctx)
    for param in group.params:  # options of `codemill` itself, given before the command
        if not getattr(param, "hidden", False):
            assert f"`{param.opts[0]}`" in cli_md, f"codemill {param.opts[0]} missing from the CLI reference"
    assert {"run", "plan", "evaluate", "rl", "problems", "calibrate", "serve", "lineage", "compare"} <= set(names)
    sections = re.split(r"^## ", cli_md, flags=re.M)
    by_name = {m.group(1): s for s in sections if (m := re.match(r"`codemill ([\w-]+)`", s))}
    for name in names:
        cmd = group.get_command(ctx, name)
        if cmd.hidden:
            continue
        assert name in by_name, f"command {name!r} missing from the CLI reference"
        for param in cmd.params:
            if getattr(param, "hidden", False):
                continue
            shown = str(param.name).upper() if param.param_type_name == "argument" else param.opts[0]
            assert f"`{shown}`" in by_name[name], f"codemill {name}: {shown} missing from the CLI reference"
        first_line = (cmd.help or "").strip().splitlines()[0]
        assert first_line.split()[0] in by_name[name]


def test_the_docs_hook_puts_both_references_in_their_pages():
    spec = importlib.util.spec_from_file_location("codemill_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    for page, marker, expect in (("configuration.md", "<!-- codemill:config-reference -->",
                                  "`rl.algorithm.clip_high`"),
                                 ("cli.md", "<!-- codemill:cli-reference -->", "## `codemill run`")):
        text = (ROOT / "docs" / page).read_text()
        assert marker in text, f"docs/{page} lost its marker"
        out = hooks.on_page_markdown(text, page=None, config=None, files=None)
        assert marker not in out and expect in out
