"""The extension interfaces page shows what the code has: every listed object with its docstring, every field
and public method, the registry's kinds as they are, and a marker on the page for every interface."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

from codemill.interface_reference import INTERFACES, interface_reference, md_docstring, registered, resolve

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "extension-interfaces.md"


def _plain(markdown: str) -> str:
    """Rendered markdown as plain words: escapes and entities undone, whitespace collapsed."""
    text = re.sub(r"\\([\\*_\[\]])", r"\1", markdown).replace("&lt;", "<").replace("&gt;", ">")
    return " ".join(text.split())


@pytest.mark.parametrize("name", sorted(INTERFACES))
def test_every_object_is_rendered_with_its_docstring_and_members(name: str) -> None:
    page = interface_reference(name)
    plain = _plain(page)
    for path in INTERFACES[name].objects:
        obj, short = resolve(path), path.partition(":")[2]
        assert f"### `{short}`" in page, path
        own = (obj.__dict__.get("__doc__") if inspect.isclass(obj)
               else obj.__doc__ if inspect.isfunction(obj) else None)  # a constant's doc is its type's
        if own and not own.startswith(f"{short}("):
            assert " ".join(inspect.cleandoc(own).split()) in plain, f"{path}: docstring missing"
        if inspect.isclass(obj):
            names = ([f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj)
                     else list(obj.__dict__.get("__annotations__", {})))
            names += [n for n, m in obj.__dict__.items() if not n.startswith("_")
                      and (inspect.isfunction(m) or isinstance(m, (property, classmethod)))
                      and n not in names]
            section = page.split(f"### `{short}`", 1)[1].split("\n### ", 1)[0]
            for member in names:
                assert re.search(rf"- `{member}[(: ]", section), f"{path}.{member} missing"


@pytest.mark.parametrize("name", sorted(INTERFACES))
def test_the_registry_line_lists_what_is_registered(name: str) -> None:
    interface = INTERFACES[name]
    kinds = registered(interface)
    assert kinds, name
    if interface.registry:
        assert kinds == list(resolve(interface.registry))
        assert f"holds: {', '.join(f'`{k}`' for k in kinds)}." in interface_reference(name)


def test_every_interface_has_its_marker_on_the_page_and_the_hook_fills_it() -> None:
    text = PAGE.read_text(encoding="utf-8")
    markers = re.findall(r"<!-- codemill:interface:(\w+) -->", text)
    assert sorted(markers) == sorted(INTERFACES)
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    built = hooks.on_page_markdown(text, page=None, config=None, files=None)
    assert "<!-- codemill:" not in built
    assert "### `Environment`" in built and "### `Algorithm`" in built


def test_docstrings_escape_markdown_outside_code_spans_only() -> None:
    out = md_docstring("Calls __init__ with <fim_prefix> and *args; ``keep __this__`` and `<tag>` stay.")
    assert out == ("Calls \\_\\_init\\_\\_ with &lt;fim\\_prefix&gt; and \\*args; ``keep __this__`` and `<tag>` "
                   "stay.")
