"""Every benchmark module imports: a benchmark is run by hand, so a rename elsewhere that breaks its imports
would otherwise surface only when someone next measures."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted(p.stem for p in (Path(__file__).parents[2] / "benchmarks").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_the_benchmark_imports(name: str) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    assert callable(getattr(module, "main", None)), f"benchmarks/{name}.py has no main()"
