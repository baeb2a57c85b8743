"""Config types built from plug-in registries, so a new plug-in is one module plus one registration line and no
config module is edited.

A plug-in (an environment, an algorithm, an eval suite, a source kind) declares its own pydantic config; the
section that chooses among plug-ins takes the discriminated union of the registered configs (the YAML and the
Prefect form show the chosen one's fields only), and a section that holds one sub-section per plug-in (evaluate)
is a model with one field per registered name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import import_module
from typing import Annotated, Any, Literal, Union

from pydantic import Field, create_model

from codemill.stage_config import StageConfig


def plugins(package: str, modules: Sequence[str], attr: str) -> list[Any]:
    """``attr`` of each plug-in module ``package.<module>``, in order: a registry is its list of module names,
    so registering a plug-in is one name on one line."""
    return [getattr(import_module(f"{package}.{m}"), attr) for m in modules]


def tagged_union(configs: Sequence[type[StageConfig]], tag: str) -> Any:
    """The discriminated union of ``configs`` on their ``tag`` field (a single config is itself)."""
    if len(configs) == 1:
        return configs[0]
    return Annotated[Union[tuple(configs)], Field(discriminator=tag)]  # noqa: UP007 - built at run time


def names_literal(names: Sequence[str]) -> Any:
    """``Literal[...]`` of the registered names: the form offers them, a typo gets the list back."""
    return Literal[tuple(names)]


def section_per_plugin(name: str, base: type[StageConfig], sections: Mapping[str, type[StageConfig]],
                       doc: str) -> type[StageConfig]:
    """``base`` plus one field per plug-in, ``<plug-in name>: <its config>``, each defaulting to its defaults."""
    fields: dict[str, Any] = {key: (cfg, Field(default_factory=cfg)) for key, cfg in sections.items()}
    model: type[StageConfig] = create_model(name, __base__=base, __doc__=doc, __module__=base.__module__, **fields)
    return model
