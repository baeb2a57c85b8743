"""What the documentation claims about the command line and the config, checked against the code.

Two kinds of claim are read from markdown:

- **Commands**: every ``codemill ...`` command line, in ``bash``/``sh``/``console``/``text`` (or untagged) code
  blocks and in inline code spans. In a block, a command is a shell simple command whose program is ``codemill``
  (or a path ending in ``/codemill``): at the start of a line (after an optional ``$`` prompt and ``NAME=value``
  assignments) or after ``&&``, ``||``, ``;``, ``|``. Lines ending in ``\\`` continue, and ``#`` starts a comment.
  A ``text`` block also holds output and prose, so there only a line that starts with a command counts. A code
  span is a command when its text starts with ``codemill``. Each command is walked against the click
  command that typer builds from ``codemill.cli:app``: every subcommand must exist, every option must exist on
  the command it is given to (``--opt=value`` included), and no command takes more positional arguments than it
  declares. Placeholders are not checked: ``<id>``, ``[OPTIONS]``, ``...``, upper-case words such as ``COMMAND``,
  and anything ending in ``...`` (``m-0123abcd...``). A placeholder where a subcommand goes ends the check.
- **Config keys**: a code span outside code blocks whose whole text is a dotted path of identifiers (``[]`` or
  ``[<key>]`` item markers allowed), optionally followed by ``: value`` or ``=value``, and whose first segment is
  the name of a config section. A path that starts at a top-level ``PipelineConfig`` field must resolve in the
  models (through every member of a union, into lists and dicts of models; a field of type ``dict`` or ``Any``
  takes any key below it), and a YAML value after ``:`` must resolve below it. A path that starts at a nested
  section (``rollout.workers``) and is the tail of a real path must be written in full (``rl.rollout.workers``);
  one that is not the tail of any path is some other dotted name (a manifest key) and is left alone. Single names
  (``max_turns``) are context-dependent and not checked, nor are file names (``augment.py``,
  ``problems.parquet``: the last segment a file suffix). ``yaml`` code blocks whose top-level keys include a
  ``PipelineConfig`` field are configs: every key in them must resolve. A YAML mapping that selects a member of a
  union by its discriminator (``kind: repo``, ``name: rft``) is checked against that member alone; one whose
  discriminator names no member of the code (the new kind of a how-to that adds one) is not checked.

``ALLOWED`` lists the few dotted names that start at a top-level field but are not config keys.

Pure: no Prefect, no MLflow; importing ``codemill.cli`` loads typer and the config models.
"""

from __future__ import annotations

import difflib
import re
import shlex
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

from codemill.reference import config_sections, nested_models

# Dotted names that start at a top-level config field but name something else.
ALLOWED = frozenset({
    "train.problems",  # an MLflow metric of the problems stage: the problems in the train split
})

SHELL_LANGS = {"", "bash", "sh", "shell", "console", "text"}
YAML_LANGS = {"yaml", "yml"}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
PATH_SPAN = re.compile(r"(?P<path>[a-z_][a-z0-9_]*(?:\[[^\]\s]*\])*(?:\.[a-z_][a-z0-9_]*(?:\[[^\]\s]*\])*)+)"
                       r"(?:\s*(?P<sep>[:=])\s*(?P<value>.*))?", re.DOTALL)
ITEM = re.compile(r"\[[^\]]*\]")
FILE_SUFFIXES = {"cfg", "gz", "ini", "json", "jsonl", "md", "npy", "parquet", "png", "py", "sh", "toml", "txt",
                 "yaml", "yml"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PLACEHOLDER = re.compile(r"<[A-Za-z][\w .'/-]*>")  # <id>, <model-id>, <digest or run id>
HIDE = str.maketrans("<> '\"", "\x01\x02\x03\x04\x05")  # a placeholder's brackets, spaces and quotes
SHOW = str.maketrans("\x01\x02\x03\x04\x05", "<> '\"")


@dataclass(frozen=True)
class Problem:
    """One false claim: where it is and what is wrong."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass(frozen=True)
class Snippet:
    """A piece of a markdown file: a fenced block's text (``lang`` its info string) or a code span (``lang``
    None), with the line it starts on."""

    line: int
    text: str
    lang: str | None


# --- markdown ------------------------------------------------------------------------------------------------

def snippets(markdown: str) -> Iterator[Snippet]:
    """Every fenced code block and every inline code span outside them. A span may cross line breaks within a
    paragraph (as CommonMark allows), never a blank line."""
    lines = markdown.splitlines()
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, indent, start = m["fence"], len(m["indent"]), i + 1
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[i]):
            line = lines[i]
            body.append(line[min(indent, len(line) - len(line.lstrip())):])  # the fence's indent, no more
            i += 1
        i += 1  # the closing fence
        prose.append((start, ""))  # a block ends the paragraph before it
        yield Snippet(start + 1, "\n".join(body), m["lang"].lower())
    yield from _spans(prose)


def _spans(prose: list[tuple[int, str]]) -> Iterator[Snippet]:
    paragraph: list[tuple[int, str]] = []
    for number, text in [*prose, (0, "")]:
        if text.strip():
            paragraph.append((number, text))
            continue
        if paragraph:
            joined = "\n".join(t for _, t in paragraph)
            for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", joined, re.DOTALL):
                line = paragraph[0][0] + joined.count("\n", 0, m.start())
                yield Snippet(line, m.group(2).strip(), None)
        paragraph = []


# --- commands ------------------------------------------------------------------------------------------------

def is_placeholder(token: str) -> bool:
    return (token.startswith(("<", "[")) or token.endswith(("...", "…")) or token in {"...", "…"}
            or (token.isupper() and token.isalpha()))


def _words(text: str) -> list[str]:
    """Shell words, with operators (``&&``, ``|``, ``>``) as words of their own; a placeholder such as
    ``<id>`` stays one word, as a reader means it."""
    text = PLACEHOLDER.sub(lambda m: m.group(0).translate(HIDE), text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return [w.translate(SHOW) for w in lexer]
    except ValueError:  # an unbalanced quote (output or prose in a text block): plain words
        return text.split()


def _is_codemill(word: str) -> bool:
    return word == "codemill" or word.endswith("/codemill")


def _operator(word: str) -> bool:
    return bool(word) and set(word) <= set("();<>|&")


def commands_in_block(text: str, shell: bool = True) -> Iterator[tuple[int, list[str]]]:
    """``(line offset, arguments after codemill)`` of every codemill command in a shell block; in a text block
    (``shell`` False: output and prose too) only of lines that start with a command."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        start, logical = i, lines[i]
        while logical.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            logical = logical.rstrip()[:-1] + " " + lines[i]
        i += 1
        stripped = logical.lstrip()
        words = _words(stripped[2:] if stripped.startswith("$ ") else stripped)
        segment: list[str] = []
        redirect, first = False, True
        for word in [*words, ";"]:
            if redirect:  # the file of a redirection
                redirect = False
            elif _operator(word) and ("<" in word or ">" in word):
                redirect = True
                if segment and segment[-1].isdigit():
                    segment.pop()  # the descriptor of 2>&1
            elif _operator(word):
                program = segment[_assignments(segment):]
                if program and _is_codemill(program[0]):
                    yield start, program[1:]
                elif first and not shell:
                    break  # a text line that does not start with a command is output or prose
                segment, first = [], False
            else:
                segment.append(word)


def _assignments(segment: list[str]) -> int:
    """How many ``NAME=value`` assignments precede the program of a simple command."""
    n = 0
    while n < len(segment) and ASSIGNMENT.match(segment[n]):
        n += 1
    return n


def command_of_span(text: str) -> list[str] | None:
    """The arguments of a code span that is a codemill command, else None."""
    words = _words(" ".join(text.split()))
    if not words or not _is_codemill(words[0]):
        return None
    return words[1:]


def _nearest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.7)
    return f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(choices))}"


def check_command(root: Any, args: list[str]) -> list[str]:
    """What is wrong with ``codemill <args>`` against the click group ``root``: unknown subcommands, unknown
    options, too many positional arguments. Empty when nothing is."""
    shown = "codemill " + " ".join(args)
    command, path, positional, only_args = root, ["codemill"], 0, False
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token in ("...", "…"):
            continue
        if token == "--" and not only_args:
            only_args = True
        elif token.startswith("-") and len(token) > 1 and not only_args:
            name = token.split("=", 1)[0]
            options = {o: p for p in command.params if getattr(p, "param_type_name", "") == "option"
                       for o in [*p.opts, *p.secondary_opts]}
            if name == "--help":
                continue
            if name not in options:
                return [f"{shown}: {' '.join(path)} has no option {name!r}{_nearest(name, [*options, '--help'])}"]
            if "=" not in token and not options[name].is_flag and not options[name].count:
                i += 1  # the option's value
        elif hasattr(command, "commands"):  # a group: the token names a subcommand
            if is_placeholder(token):
                return []  # a placeholder command: nothing more can be checked
            if token not in command.commands:
                return [f"{shown}: {' '.join(path)} has no command {token!r}{_nearest(token, list(command.commands))}"]
            command, path = command.commands[token], [*path, token]
        else:
            positional += 1
            arguments = [p for p in command.params if getattr(p, "param_type_name", "") == "argument"]
            if positional > len(arguments) and not any(p.nargs == -1 for p in arguments):
                return [f"{shown}: {' '.join(path)} takes {len(arguments)} argument(s); {token!r} is one too many"]
    return []


# --- config paths --------------------------------------------------------------------------------------------

def _strip_annotated(t: Any) -> Any:
    while hasattr(t, "__metadata__"):
        t = get_args(t)[0]
    return t


def _open_below(annotation: Any) -> bool:
    """A leaf field that takes any key below it: a dict (of non-models) or ``Any``."""
    t = _strip_annotated(annotation)
    if t is Any:
        return True
    if get_origin(t) in (Union, types.UnionType):
        return any(_open_below(a) for a in get_args(t) if a is not type(None))
    return get_origin(t) is dict or t is dict


def resolves(models: list[type[BaseModel]], segments: list[str]) -> bool:
    """Whether the dotted ``segments`` name a field path in any of ``models`` (the members of a union)."""
    if not segments:
        return True
    for model in models:
        info = model.model_fields.get(segments[0])
        if info is None:
            continue
        below = [m for _, m in nested_models(info.annotation)]
        if below and resolves(below, segments[1:]):
            return True
        if not below and (len(segments) == 1 or _open_below(info.annotation)):
            return True
    return False


class ConfigPaths:
    """Every field path of a config model (default ``PipelineConfig``), written without item markers."""

    def __init__(self, model: type[BaseModel] | None = None) -> None:
        sections = config_sections(model)
        self.root: type[BaseModel] = sections[0].model
        self.paths = sorted({ITEM.sub("", row.path) for s in sections for row in s.rows})
        self.top = set(self.root.model_fields)
        self.sections = {p.rsplit(".", 1)[-1] for s in sections[1:] for p in [ITEM.sub("", s.path)]}

    def valid(self, path: str) -> bool:
        return resolves([self.root], ITEM.sub("", path).split("."))

    def nearest(self, path: str) -> str:
        close = difflib.get_close_matches(ITEM.sub("", path), self.paths, n=1, cutoff=0.6)
        return f"; did you mean {close[0]!r}?" if close else ""

    def full_forms(self, path: str) -> list[str]:
        """The full paths that end with the relative ``path``."""
        tail = "." + ITEM.sub("", path)
        return [p for p in self.paths if p.endswith(tail)]

    def check_span(self, text: str) -> list[str]:
        """What is wrong with a code span, if it is a config path (the module docstring's rule)."""
        m = PATH_SPAN.fullmatch(text)
        if not m or m["path"] in ALLOWED or m["path"].rsplit(".", 1)[-1] in FILE_SUFFIXES:
            return []
        path = m["path"]
        first = ITEM.sub("", path.split(".", 1)[0])
        if first not in self.top:
            full = self.full_forms(path) if first in self.sections else []
            if full:
                return [f"config key {path!r} is not a full path: write {' or '.join(repr(f) for f in full)}"]
            return []
        if not self.valid(path):
            return [f"config key {path!r} does not exist{self.nearest(path)}"]
        if m["sep"] == ":" and m["value"]:
            try:
                node = yaml.compose(m["value"])
            except yaml.YAMLError:
                return []
            if node is None:
                return []
            segments = ITEM.sub("", path).split(".")
            return [message for _, message in self._walk(node, segments, self._models_at(segments))]
        return []

    def check_yaml(self, text: str) -> list[tuple[int, str]]:
        """``(line offset, message)`` for every key of a YAML config block that is not a config field; a block
        whose top-level keys name no ``PipelineConfig`` field is not a config and is skipped."""
        try:
            node = yaml.compose(text)
        except yaml.YAMLError as e:
            return [(0, f"YAML that does not parse: {e}")]
        if not isinstance(node, yaml.MappingNode):
            return []
        if not any(isinstance(k, yaml.ScalarNode) and k.value in self.top for k, _ in node.value):
            return []
        return list(self._walk(node, []))

    def _walk(self, node: yaml.Node, prefix: list[str],
              models: list[type[BaseModel]] | None = None) -> Iterator[tuple[int, str]]:
        """The keys of ``node`` (the value at ``prefix``, one of ``models``) that are no field."""
        models = [self.root] if models is None else models
        if isinstance(node, yaml.SequenceNode):
            for item in node.value:
                yield from self._walk(item, prefix, models)
            return
        if not isinstance(node, yaml.MappingNode):
            return
        chosen = _chosen_members(node, models)
        if not chosen:
            return  # a union member the code does not have (a how-to's new kind): its keys are unknown here
        for key, value in node.value:
            name, path = str(key.value), [*prefix, str(key.value)]
            infos = [m.model_fields[name] for m in chosen if name in m.model_fields]
            if not infos:
                dotted = ".".join(path)
                if any(name in m.model_fields for m in models):  # a field of another member of the union
                    members = " or ".join(m.__name__ for m in chosen)
                    yield key.start_mark.line, f"config key {dotted!r} is not a field of {members}, the form chosen"
                else:
                    yield key.start_mark.line, f"config key {dotted!r} does not exist{self.nearest(dotted)}"
                continue
            below = [m for info in infos for _, m in nested_models(info.annotation)]
            if below:
                yield from self._walk(value, path, below)

    def _models_at(self, path: list[str]) -> list[type[BaseModel]]:
        """The config models a (valid) path holds: several for a union, none for a leaf."""
        models: list[type[BaseModel]] = [self.root]
        for segment in path:
            models = [m for model in models if segment in model.model_fields
                      for _, m in nested_models(model.model_fields[segment].annotation)]
        return models


def _literal_values(model: type[BaseModel], name: str) -> tuple[Any, ...]:
    info = model.model_fields.get(name)
    t = _strip_annotated(info.annotation) if info else None
    return get_args(t) if get_origin(t) is Literal else ()


def _chosen_members(node: yaml.MappingNode, models: list[type[BaseModel]]) -> list[type[BaseModel]]:
    """The members of a union of models that a YAML mapping selects by its discriminator (a ``Literal`` field
    every member has, such as ``kind`` or ``name``); all of them when it names none or there is no union."""
    if len(models) < 2:
        return models
    for key, value in node.value:
        if isinstance(value, yaml.ScalarNode) and all(_literal_values(m, str(key.value)) for m in models):
            return [m for m in models if value.value in _literal_values(m, str(key.value))]
    return models


# --- files ---------------------------------------------------------------------------------------------------

def check_markdown(name: str, markdown: str, root: Any, config: ConfigPaths) -> list[Problem]:
    """Every false claim about commands and config keys in one markdown file."""
    problems: list[Problem] = []
    for snippet in snippets(markdown):
        if snippet.lang is None:
            args = command_of_span(snippet.text)
            messages = check_command(root, args) if args is not None else config.check_span(snippet.text)
            problems += [Problem(name, snippet.line, m) for m in messages]
        elif snippet.lang in SHELL_LANGS:
            for offset, args in commands_in_block(snippet.text, shell=snippet.lang != "text"):
                problems += [Problem(name, snippet.line + offset, m) for m in check_command(root, args)]
        elif snippet.lang in YAML_LANGS:
            problems += [Problem(name, snippet.line + offset, m) for offset, m in config.check_yaml(snippet.text)]
    return problems


def doc_files(repo: Path) -> list[Path]:
    """README.md and every markdown file under docs/, recursively."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def cli_root() -> Any:
    """The click group typer builds for ``codemill.cli:app``."""
    import typer

    from codemill.cli import app

    return typer.main.get_command(app)
