"""MkDocs hook: the reference pages are generated from the code at build time, never copied by hand.

``docs/configuration.md`` and ``docs/cli.md`` hold a marker line; ``on_page_markdown`` replaces it with
``codemill.reference.config_reference()`` / ``cli_reference()``. ``docs/reference/extension-interfaces.md`` holds
one marker per extension interface, replaced with ``codemill.interface_reference.interface_reference(name)``.
``docs/changelog.md`` shows the repository's ``CHANGELOG.md``, with its links into ``docs/`` made relative to the
site. Listed under ``hooks:`` in ``mkdocs.yml``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from codemill.interface_reference import INTERFACES, interface_reference
from codemill.reference import cli_reference, config_reference

CHANGELOG = Path(__file__).resolve().parents[1] / "CHANGELOG.md"


def changelog() -> str:
    """CHANGELOG.md without its title (the page has its own), its ``docs/`` links pointing into the site."""
    text = CHANGELOG.read_text(encoding="utf-8").split("\n", 1)[1]
    return re.sub(r"\]\(docs/", "](", text)


MARKERS: dict[str, Callable[[], str]] = {
    "<!-- codemill:changelog -->": changelog,
    "<!-- codemill:config-reference -->": config_reference,
    "<!-- codemill:cli-reference -->": cli_reference,
    **{f"<!-- codemill:interface:{name} -->": partial(interface_reference, name) for name in INTERFACES},
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
