"""MkDocs hook: the reference pages are generated from the code at build time, never copied by hand.

``docs/configuration.md`` and ``docs/cli.md`` hold a marker line; ``on_page_markdown`` replaces it with
``codemill.reference.config_reference()`` / ``cli_reference()``. Listed under ``hooks:`` in ``mkdocs.yml``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from codemill.reference import cli_reference, config_reference

MARKERS: dict[str, Callable[[], str]] = {
    "<!-- codemill:config-reference -->": config_reference,
    "<!-- codemill:cli-reference -->": cli_reference,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
