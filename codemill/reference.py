"""Reference pages generated from the code: every field of ``PipelineConfig`` and every ``codemill`` command.

The docs site (``docs/configuration.md``, ``docs/cli.md``) holds only a marker where the reference goes;
``docs/hooks.py`` replaces it with ``config_reference()`` / ``cli_reference()`` at build time. So the reference
cannot drift from the code: a new field or command appears on the next build, with the description and help
text written next to it in the code.

Pure: no Prefect, no MLflow. ``cli_reference`` imports ``codemill.cli`` (typer, rich, the config) when called.
"""

from __future__ import annotations

import json
import re
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

LONG_DEFAULT = 80  # characters: a longer default is printed below its table, not in a cell


# --- markdown helpers -----------------------------------------------------------------------------------------

_SPECIAL = re.compile(r"([\\*_\[\]|])")


def md_text(text: str) -> str:
    """Prose for a markdown table cell: one line, pipes and emphasis characters escaped, ``<`` as an entity
    (``<EMAIL>`` is a placeholder, not a tag). Code spans (single or double backticks) are kept as written."""
    text = " ".join(text.split())
    out = []
    for i, part in enumerate(re.split(r"(``.+?``|`[^`]+`)", text)):
        if i % 2:  # a code span: pipes inside do not split a cell, and escapes would show literally
            out.append(part)
        else:
            out.append(_SPECIAL.sub(r"\\\1", part).replace("<", "&lt;").replace(">", "&gt;"))
    return "".join(out)


def code(text: str) -> str:
    """``text`` as an inline code span (longer backtick fences when it holds backticks)."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def anchor(path: str) -> str:
    """The HTML id of a config section: ``ingest.sources[]`` -> ``cfg-ingest-sources``."""
    slug = re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")
    return f"cfg-{slug}" if slug else "cfg-top-level"


# --- the config reference -------------------------------------------------------------------------------------

@dataclass
class Row:
    path: str
    type: str
    default: str
    description: str
    long_default: str | None = None


@dataclass
class Section:
    path: str
    model: type[BaseModel]
    depth: int
    note: str = ""
    anchor: str = ""
    rows: list[Row] = field(default_factory=list)


def _strip_annotated(t: Any) -> Any:
    while get_origin(t) is Annotated:
        t = get_args(t)[0]
    return t


def _union_args(t: Any) -> tuple[Any, ...] | None:
    return get_args(t) if get_origin(t) in (Union, types.UnionType) else None


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def type_name(t: Any) -> str:
    """A field's annotation as a reader writes it: ``int | None``, ``list[str]``, ``"cosine" | "wsd"``."""
    t = _strip_annotated(t)
    if t is type(None):
        return "None"
    if t is Any:
        return "any"
    origin = get_origin(t)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in get_args(t))
    union = _union_args(t)
    if union is not None:
        return " | ".join(type_name(a) for a in union)
    if origin is not None:
        args = get_args(t)
        name = getattr(origin, "__name__", str(origin))
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{type_name(args[0])}, ...]"
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    if isinstance(t, type):
        return t.__name__
    return str(t).replace("typing.", "")


def nested_models(t: Any) -> list[tuple[str, type[BaseModel]]]:
    """The config models a field holds, each with the path suffix of its items: ``("", M)`` for ``M`` or
    ``M | None``, ``("[]", M)`` for ``list[M]``, ``("[<key>]", M)`` for ``dict[str, M]``; every member of a union
    of models (a discriminated union) is listed. Empty for a leaf field."""
    t = _strip_annotated(t)
    union = _union_args(t)
    if union is not None:
        return [m for a in union if a is not type(None) for m in nested_models(a)]
    origin = get_origin(t)
    if origin in (list, tuple, set, frozenset):
        return [(f"[]{suffix}", m) for arg in get_args(t) if arg is not Ellipsis
                for suffix, m in nested_models(arg)]
    if origin is dict:
        args = get_args(t)
        return [(f"[<key>]{suffix}", m) for suffix, m in nested_models(args[1])] if len(args) == 2 else []
    return [("", t)] if _is_model(t) else []


def _constraints(info: FieldInfo) -> str:
    """``> 0, ≤ 1`` from the field's annotated-types metadata (pydantic's gt/ge/lt/le)."""
    signs = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "length ≥", "max_length": "length ≤"}
    found = []
    for item in info.metadata:
        for attr, sign in signs.items():
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{sign} {value}")
    return ", ".join(found)


def _runtime_only(info: FieldInfo) -> bool:
    extra = info.json_schema_extra
    return isinstance(extra, dict) and extra.get("affects_output") is False


def _field_default(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return info.get_default(call_default_factory=True, validated_data={})
    return info.default


def _json_value(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return value


def default_text(value: Any) -> str:
    """A default as it is written in a YAML config (JSON is YAML's flow style): ``null``, ``0.5``, ``"cosine"``,
    ``[{"name": "val_bpb", "margin": 0.01}]`` (a model in a list shows only what differs from its defaults)."""
    if value is PydanticUndefined:
        return "required"
    return json.dumps(_json_value(value), ensure_ascii=False)


def _section_anchor(path: str, kinds: list[tuple[str, type[BaseModel]]], model: type[BaseModel]) -> str:
    """A section's id; the members of a union of models share a path, so theirs add the model's name."""
    return anchor(path) if len(kinds) == 1 else f"{anchor(path)}-{model.__name__.lower()}"


def _walk(model: type[BaseModel], path: str, instance: BaseModel | None, depth: int, note: str, anchor_id: str,
          out: list[Section]) -> None:
    section = Section(path, model, depth, note, anchor_id)
    out.append(section)
    children: list[tuple[str, type[BaseModel], BaseModel | None, str, str]] = []
    for name, info in model.model_fields.items():
        full = f"{path}.{name}" if path else name
        value = getattr(instance, name) if instance is not None else _field_default(info)
        kinds = nested_models(info.annotation)
        type_cell = code(type_name(info.annotation))
        if len(kinds) == 1:  # the type links to the section of the model it holds
            type_cell = f"[{type_cell}](#{anchor(full + kinds[0][0])})"
        elif kinds:
            type_cell += " (" + ", ".join(f"[{m.__name__}](#{_section_anchor(full + suffix, kinds, m)})"
                                          for suffix, m in kinds) + ")"
        limits = _constraints(info)
        if limits:
            type_cell += f" ({md_text(limits)})"
        description = md_text(info.description or "")
        if _runtime_only(info):
            description = (description + " " if description else "") + "*Runtime-only: not part of the digest.*"
        text = default_text(value)
        if len(kinds) == 1 and kinds[0][0] == "" and isinstance(value, BaseModel):
            cell, long_default = "see below", None  # a nested section: its rows show the defaults
        elif len(text) > LONG_DEFAULT:
            cell, long_default = "see below the table", text
        elif len(kinds) > 1 and isinstance(value, BaseModel):
            cell, long_default = f"{code(type(value).__name__)} {code(text)}", None  # which form, and its values
        else:
            cell, long_default = code(text), None
        section.rows.append(Row(full, type_cell, cell, description, long_default))
        for suffix, m in kinds:
            sub = value if suffix == "" and isinstance(value, m) else None
            if suffix.startswith("[<key>]"):
                child_note = f"Each value of {code(full)}. Fields left out of a value take these defaults."
            elif suffix:
                child_note = f"Each item of {code(full)}. Fields left out of an item take these defaults."
            elif value is None:
                child_note = (f"Optional: {code(full)} is {code(text)} by default. When it is given, its fields "
                              "default as below.")
            else:
                child_note = ""
            if len(kinds) > 1:
                how = f", chosen by {code(info.discriminator)}" if isinstance(info.discriminator, str) else ""
                form = f"One of the forms of {code(full)}{how}: {m.__name__}."
                child_note = f"{child_note} {form}" if child_note else form
            children.append((full + suffix, m, sub, child_note, _section_anchor(full + suffix, kinds, m)))
    for child_path, m, sub, child_note, child_anchor in children:
        _walk(m, child_path, sub, depth + 1, child_note, child_anchor, out)


def config_sections(model: type[BaseModel] | None = None) -> list[Section]:
    """Every config model reachable from ``model`` (default ``PipelineConfig``), depth first in field order, each
    with its rows. Defaults come from a default instance, so a field whose default differs by where it sits
    (``rl.warm_start`` is a ``FinetuneConfig`` with its own defaults) shows the default it has there."""
    if model is None:
        from codemill.config import PipelineConfig

        model = PipelineConfig
    out: list[Section] = []
    _walk(model, "", model(), 0, "", anchor(""), out)
    return out


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def config_reference(model: type[BaseModel] | None = None) -> str:
    """Markdown: one section per config model (the top level, then every nested section in field order), each a
    table of its fields: dotted path, type with its bounds, default, description."""
    lines: list[str] = []
    for s in config_sections(model):
        level = "#" * (2 + min(max(s.depth - 1, 0), 2))
        title = code(s.path) if s.path else "Top level"
        lines += [f"{level} {title} {{#{s.anchor}}}", ""]
        doc = _first_paragraph(s.model.__dict__.get("__doc__"))
        about = f"Model {code(s.model.__name__)}" + (f": {md_text(doc)}" if doc else ".")
        lead = f"{s.note} {about}" if s.note else about
        lines += [lead, ""]
        lines += ["| field | type | default | description |", "|---|---|---|---|"]
        for r in s.rows:
            lines.append(f"| {code(r.path)} | {r.type} | {r.default} | {r.description} |")
        lines.append("")
        for r in s.rows:
            if r.long_default is not None:
                lines += [f"Default of {code(r.path)}:", "", "```json", r.long_default, "```", ""]
    return "\n".join(lines).rstrip() + "\n"


# --- the CLI reference ----------------------------------------------------------------------------------------

def _param_type(param: Any, ctx: Any) -> str:
    """The type a parameter shows in ``--help``: typer's display type, or click's type name."""
    display = getattr(param, "display_type", None)
    if callable(display):
        try:
            text = str(display(ctx))
        except TypeError:
            text = str(display())
        return text.strip("<>")
    return str(getattr(getattr(param, "type", None), "name", ""))


def _param_bounds(param: Any) -> str:
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    if lo is None and hi is None and hasattr(param, "type"):
        lo, hi = getattr(param.type, "min", None), getattr(param.type, "max", None)
    return ", ".join(f"{sign} {v}" for sign, v in (("≥", lo), ("≤", hi)) if v is not None)


def _is_argument(param: Any) -> bool:
    return getattr(param, "param_type_name", "") == "argument"


def _param_row(param: Any, ctx: Any) -> str:
    flag = bool(getattr(param, "is_flag", False))
    if _is_argument(param):
        name = code(str(param.name).upper())
    else:
        name = " / ".join(code(o) for o in [*param.opts, *param.secondary_opts])
    kind = "flag" if flag else _param_type(param, ctx)
    bounds = _param_bounds(param)
    if bounds:
        kind += f" ({bounds})"
    if getattr(param, "multiple", False):
        inner = re.fullmatch(r"list\[(.*)\]", kind)  # typer shows a repeatable option's type as list[X]
        kind = f"{inner.group(1) if inner else kind}, repeatable"
    default = param.default
    if getattr(param, "required", False):
        shown = "required"
    elif default is None or default == () or (flag and default is False) or callable(default):
        shown = ""
    else:
        shown = code(json.dumps(default) if isinstance(default, (bool, float, int, str)) else str(default))
    return f"| {name} | {md_text(kind)} | {shown} | {md_text(str(getattr(param, 'help', None) or ''))} |"


def _usage(name: str, cmd: Any) -> str:
    parts = [name]
    if any(not _is_argument(p) for p in cmd.params):
        parts.append("[OPTIONS]")
    for p in cmd.params:
        if _is_argument(p):
            arg = str(p.name).upper() + ("..." if getattr(p, "nargs", 1) == -1 else "")
            parts.append(arg if getattr(p, "required", False) else f"[{arg}]")
    return " ".join(parts)


def _help_markdown(text: str | None) -> list[str]:
    """A command's docstring as markdown paragraphs (its line breaks are the source's wrapping)."""
    if not text:
        return []
    out: list[str] = []
    for para in text.strip().split("\n\n"):
        out += [md_text(para), ""]
    return out


def _group(app: Any) -> tuple[Any, Any]:
    """The click group typer builds for ``app`` (default ``codemill.cli:app``) and its root context."""
    import typer

    if app is None:
        from codemill import cli

        app = cli.app
    group: Any = typer.main.get_command(app)
    return group, group.context_class(group, info_name="codemill")


def cli_commands(app: Any = None) -> Iterator[tuple[str, Any, Any]]:
    """``(name, command, context)`` of every visible command of the app (default ``codemill.cli:app``), in the
    order ``codemill --help`` lists them."""
    group, ctx = _group(app)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or getattr(cmd, "hidden", False):
            continue
        yield name, cmd, cmd.context_class(cmd, info_name=name, parent=ctx)


def cli_reference(app: Any = None) -> str:
    """Markdown: the app's own options (if any), then per command its help text, usage and a table of its
    arguments and options (type, default, help)."""
    group, root_ctx = _group(app)
    lines: list[str] = []
    visible_root = [p for p in group.params if not getattr(p, "hidden", False)]
    if visible_root:
        lines += ["## Options of `codemill` itself", "", "Given before the command: "
                  f"{code('codemill [OPTIONS] COMMAND ...')}.", "",
                  "| option | type | default | description |", "|---|---|---|---|"]
        lines += [_param_row(p, root_ctx) for p in visible_root]
        lines.append("")
    for name, cmd, ctx in cli_commands(app):
        lines += [f"## `codemill {name}`", ""]
        lines += _help_markdown(cmd.help)
        lines += ["```text", _usage(f"codemill {name}", cmd), "```", ""]
        params = [p for p in cmd.params if not getattr(p, "hidden", False)]
        if params:
            lines += ["| argument / option | type | default | description |", "|---|---|---|---|"]
            lines += [_param_row(p, ctx) for p in params]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
