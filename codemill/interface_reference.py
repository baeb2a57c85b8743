"""The extension interfaces, rendered from their docstrings: what a new environment, eval suite, corpus source
kind or RL update rule implements, and the registry it joins.

``docs/reference/extension-interfaces.md`` holds one marker per interface; ``docs/hooks.py`` replaces each with
``interface_reference(name)`` at build time, so the page shows the signatures, fields and docstrings the code has,
never a copy of them. The prose around the markers (which how-to guide to follow) stays on the page.

Pure: imports the interface modules (numpy, polars, pydantic; no torch, Prefect or MLflow) when called.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import re
import textwrap
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, get_args

from codemill.reference import code, type_name


@dataclass(frozen=True)
class Interface:
    """One extension point: the module whose docstring describes it, the registry a new one joins (``module:NAME``,
    a dict keyed by kind or name), the config type that lists the kinds, and the objects a new one implements or
    receives (``module:name``)."""

    title: str
    module: str
    registry: str
    config: str
    objects: tuple[str, ...]


INTERFACES: dict[str, Interface] = {
    "environment": Interface(
        "RL environment", "codemill.rl.env", "codemill.rl.envs:ENVIRONMENTS", "codemill.rl.config:EnvConfig",
        ("codemill.rl.env:Environment", "codemill.rl.env:EnvContext", "codemill.rl.env:Reset",
         "codemill.rl.env:StepResult", "codemill.rl.env:StepInfo", "codemill.rl.env:EpisodeLimits",
         "codemill.rl.env:Task", "codemill.rl.env:Episode", "codemill.rl.env:CUT_REASONS")),
    "suite": Interface(
        "Eval suite", "codemill.evals.suites.base", "codemill.evals.suites:REGISTRY", "codemill.evals.config:SuiteName",
        ("codemill.evals.suites.base:Suite", "codemill.evals.suites.base:SuiteRun",
         "codemill.evals.suites.base:Metric", "codemill.evals.suites.base:Need",
         "codemill.evals.suites.base:EvalModel", "codemill.evals.stats:ItemScores",
         "codemill.evals.suites.base:ci", "codemill.evals.suites.base:scores",
         "codemill.evals.suites.base:sampler_config")),
    "source": Interface(
        "Corpus source", "codemill.data.sources.base", "codemill.data.sources:SOURCE_KINDS",
        "codemill.data.config:SourceConfig",
        ("codemill.data.sources.base:CorpusSource", "codemill.data.sources.base:TableSource",
         "codemill.data.sources.base:FileTableSource", "codemill.data.sources.base:ChunkSpec",
         "codemill.data.sources.base:RAW_SCHEMA", "codemill.data.sources.base:table_rows",
         "codemill.data.sources.base:SourceError")),
    "algorithm": Interface(
        "RL update rule", "codemill.rl.algorithms.base", "codemill.rl.algorithms:ALGORITHMS",
        "codemill.rl.config:AlgorithmConfig",
        ("codemill.rl.algorithms.base:Algorithm", "codemill.rl.algorithms.base:UpdateInputs",
         "codemill.rl.algorithms.base:UpdateJob")),
}


def resolve(path: str) -> Any:
    """The object ``module:name`` names."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# --- markdown -------------------------------------------------------------------------------------------------

_CODE_SPAN = re.compile(r"(``.+?``|`[^`]+`)", re.S)
_SPECIAL = re.compile(r"([\\*_\[\]])")


def md_docstring(doc: str | None) -> str:
    """A docstring as markdown: its paragraphs and ``- `` lists kept, code spans kept as written, and outside them
    the characters markdown would read as emphasis, links or HTML escaped (``__init__``, ``<fim_prefix>``)."""
    if not doc:
        return ""
    text = inspect.cleandoc(doc)
    parts = _CODE_SPAN.split(text)
    out = [part if i % 2 else _SPECIAL.sub(r"\\\1", part).replace("<", "&lt;").replace(">", "&gt;")
           for i, part in enumerate(parts)]
    return "".join(out)


def _annotation(value: Any) -> str:
    return value if isinstance(value, str) else type_name(value)


def signature(fn: Callable[..., Any], name: str | None = None) -> str:
    """``name(a: int, *, b: str = 'x') -> R`` with the annotations as written in the source (no ``self``)."""
    sig = inspect.signature(fn)
    params: list[str] = []
    star_added = False
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        if p.kind is p.KEYWORD_ONLY and not star_added:
            params.append("*")
            star_added = True
        prefix = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        text = prefix + p.name
        if p.kind is p.VAR_POSITIONAL:
            star_added = True
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        params.append(text)
    returns = "" if sig.return_annotation is sig.empty else f" -> {_annotation(sig.return_annotation)}"
    return f"{name or fn.__name__}({', '.join(params)}){returns}"


def field_comments(cls: type) -> dict[str, str]:
    """What each annotated attribute in ``cls``'s body is for, from its comments: the full-line comments right
    above it and the one trailing it (where the docstring does not say it)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    trailing = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    out: dict[str, str] = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        row = node.lineno - 1  # 1-based: the line above the attribute
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, lines[row - 1].strip().lstrip("#").strip())
            row -= 1
        same = trailing.get(node.lineno) if not lines[node.lineno - 1].strip().startswith("#") else None
        text = " ".join([*above, *([same] if same else [])])
        if text:
            out[node.target.id] = text
    return out


def _default(field: dataclasses.Field[Any]) -> str | None:
    """A dataclass field's default as code (None: required): a factory as its call, a function by its name."""
    if field.default_factory is not dataclasses.MISSING:
        return f"{getattr(field.default_factory, '__name__', 'factory')}()"
    if field.default is dataclasses.MISSING:
        return None
    if callable(field.default):
        return str(getattr(field.default, "__name__", "<function>"))
    return repr(field.default)


def _attributes(cls: type) -> list[str]:
    """``name: type = default`` and what it is for, of each attribute: a dataclass's fields, a protocol's
    annotations."""
    comments = field_comments(cls)
    if dataclasses.is_dataclass(cls):
        items = [(f.name, f.type, _default(f)) for f in dataclasses.fields(cls)]
    else:
        items = [(n, t, None) for n, t in cls.__dict__.get("__annotations__", {}).items()]
    lines: list[str] = []
    for name, annotation, default in items:
        text = f"{name}: {_annotation(annotation)}" + (f" = {default}" if default is not None else "")
        note = f": {md_docstring(comments[name])}" if name in comments else ""
        lines.append(f"- {code(text)}{note}")
    return lines


def _members(cls: type) -> list[str]:
    """Each public method and property defined in ``cls`` itself, with its signature and docstring."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    lines: list[str] = []
    for name, member in cls.__dict__.items():
        if name.startswith("_") or name in fields:  # a field's default function is not a method
            continue
        target = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if isinstance(target, (property, cached_property)):
            fget = target.fget if isinstance(target, property) else target.func
            if fget is None:
                continue
            head = f"{name} -> {_annotation(inspect.signature(fget).return_annotation)}"
            kind = "property"
        elif inspect.isfunction(target):
            head = signature(target, name)
            kind = "classmethod" if isinstance(member, classmethod) else "method"
        else:
            continue
        doc = md_docstring(inspect.getdoc(target) if kind != "property" else (target.__doc__ or ""))
        lines.append(f"- {code(head)} ({kind})" + (f": {_indent(doc)}" if doc else ""))
    return lines


def _indent(text: str) -> str:
    """Continuation lines of a list item's text, indented under it (a blank line keeps the paragraph break)."""
    return "\n".join(line if i == 0 or not line else "    " + line for i, line in enumerate(text.splitlines()))


def render_object(path: str) -> str:
    """One object's section: heading, where it lives, what it is, and its attributes and members."""
    module, _, name = path.partition(":")
    obj = resolve(path)
    lines = [f"### `{name}`", ""]
    if inspect.isclass(obj):
        bases = [b.__name__ for b in obj.__bases__ if b is not object]
        is_protocol = getattr(obj, "_is_protocol", False)
        kind = "protocol" if is_protocol else "dataclass" if dataclasses.is_dataclass(obj) else "class"
        extends = f", extends {', '.join(code(b) for b in bases if b not in ('Protocol', 'Generic'))}" \
            if [b for b in bases if b not in ("Protocol", "Generic")] else ""
        lines += [f"{code(f'{module}.{name}')}: {kind}{extends}.", ""]
        own = obj.__dict__.get("__doc__")
        generated = dataclasses.is_dataclass(obj) and (own or "").startswith(f"{name}(")  # dataclass's own text
        doc = "" if generated else md_docstring(own)
        if doc:
            lines += [doc, ""]
        attrs, members = _attributes(obj), _members(obj)
        if attrs:
            lines += ["Attributes:", "", *attrs, ""]
        if members:
            lines += ["Methods:", "", *members, ""]
    elif inspect.isfunction(obj):
        lines += ["```python", f"{module}.{signature(obj)}", "```", ""]
        doc = md_docstring(inspect.getdoc(obj))
        if doc:
            lines += [doc, ""]
    else:
        lines += [f"{code(f'{module}.{name}')}:", "", "```python", f"{name} = {_value(obj)}", "```", ""]
    return "\n".join(lines)


def _value(obj: Any) -> str:
    """A constant as code: a type alias by its name, a dict of types with their names, anything else by repr."""
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k!r}: {_value(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, tuple):
        return "(" + ", ".join(_value(v) for v in obj) + ("," if len(obj) == 1 else "") + ")"
    if isinstance(obj, (str, int, float)):
        return repr(obj)
    return type_name(obj) if not isinstance(obj, type) else obj.__name__


def registered(interface: Interface) -> list[str]:
    """What is registered today: the registry's keys, or, with no registry, the values the config type allows."""
    if interface.registry:
        return list(resolve(interface.registry))
    return [str(a) for a in get_args(resolve(interface.config))]


def interface_reference(name: str) -> str:
    """Markdown for one interface: its module's docstring, the registry and what it holds, then each object."""
    interface = INTERFACES[name]
    lines = [md_docstring(importlib.import_module(interface.module).__doc__), ""]
    kinds = ", ".join(code(k) for k in registered(interface))
    if interface.registry:
        reg_module, _, reg_name = interface.registry.partition(":")
        lines += [f"**Registry** {code(f'{reg_module}.{reg_name}')} holds: {kinds}.", ""]
        reg_doc = md_docstring(importlib.import_module(reg_module).__doc__)
        if reg_doc:
            lines += [reg_doc, ""]
    config_module, _, config_name = interface.config.partition(":")
    lines += [f"**Config** {code(f'{config_module}.{config_name}')}: {code(type_name(resolve(interface.config)))}.",
              ""]
    for path in interface.objects:
        lines.append(render_object(path))
    return "\n".join(lines).rstrip() + "\n"
