"""Modules imported on first use: for the optional heavy dependencies (torch) of modules that must stay cheap to
import, such as a plug-in whose config the pipeline config composes but whose work runs in another process."""

from __future__ import annotations

import importlib
import types
from typing import Any


class LazyModule(types.ModuleType):
    """A stand-in for module ``name``: the first attribute read imports it and copies its namespace in, so later
    reads cost what a plain module attribute costs."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._lazy_name = name

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._lazy_name)
        self.__dict__.update(module.__dict__)
        return getattr(module, attr)


def lazy_module(name: str) -> Any:
    """Module ``name``, imported when first used."""
    return LazyModule(name)
