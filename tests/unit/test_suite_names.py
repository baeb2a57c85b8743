"""No suite or metric name appears in the package outside the suite's own modules: planning, the run summary,
``codemill compare``, the noise model and the gate loop over the registry (``Suite.needs``, ``Metric``'s unit,
direction and hold margin, the display hooks) instead of branching on a name.

The scan reads string literals, never docstrings or comments (prose may name a suite). A metric name, a logged
summary key or a word that starts with a suite's summary-key prefix (``latency_``) is a hit anywhere. A suite's
name is a common word (a sample's ``completion``, the ``humaneval`` dataset, the ``repo_tasks`` stage), so a
literal that is exactly a suite's name is a hit where its line speaks of suites (``"x" in cfg.evaluate.suites``,
``suite == "x"``) and ``"eval:<name>"`` is a hit anywhere.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from codemill.evals.suites import REGISTRY, Suite

PACKAGE = Path(__file__).resolve().parents[2] / "codemill"
# Config text that must list the names: the gate's default metrics and the description of a gate metric's name.
LISTS = {"gate/config.py"}
REGISTRATION = "SUITE_MODULES"  # the registry's one line of module names (``evals/suites/__init__.py``)
SHARED = {"config", "stats", "suites"}  # what every suite imports from ``codemill.evals``: no suite's own
WORD = re.compile(r"[A-Za-z0-9_]+")


def package_files() -> Iterator[Path]:
    """Every module of the package, the root folders it links to included."""
    for folder, _, names in os.walk(PACKAGE, followlinks=True):
        yield from (Path(folder) / n for n in sorted(names) if n.endswith(".py"))


def literals(tree: ast.AST) -> Iterator[ast.Constant]:
    """The string literals of a module (f-string parts included), less its docstrings and bare string lines, and
    less the registration of the suites' modules."""
    bodies = (body for node in ast.walk(tree) if isinstance(body := getattr(node, "body", None), list))
    prose = {id(s.value) for body in bodies for s in body
             if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)}
    prose |= {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == REGISTRATION for t in node.targets)
              for c in ast.walk(node.value)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node


def stage_names() -> set[str]:
    """The stages the package names (module-level ``STAGE = "..."``): a prefix ``<stage>_`` names its things."""
    out = set()
    for path in package_files():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "STAGE" for t in node.targets)
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                out.add(node.value.value)
    return out


def own_modules(suite: Suite) -> set[str]:
    """The suite's module and the ``codemill.evals`` library modules it is built on (package-relative paths)."""
    module = f"evals/suites/{suite.name}.py"
    imported: set[str] = set()
    for node in ast.walk(ast.parse((PACKAGE / module).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "codemill.evals":
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("codemill.evals."):
            imported.add((node.module or "").split(".")[2])
    libraries = {f"evals/{m}.py" for m in imported - SHARED}
    return {module} | {m for m in libraries if (PACKAGE / m).is_file()}


def hits(suite: Suite, rel: str, source: str, stages: set[str]) -> list[str]:
    """Where ``source`` (the module at ``rel``) names ``suite`` or one of its metrics or summary keys."""
    metrics = {m.name for m in suite.metrics}
    keys = {k for k in suite.logged if not k.endswith("_")}
    prefixes = tuple(p for p in suite.logged if p.endswith("_") and p.removesuffix("_") not in stages)
    lines = source.splitlines()
    found = []
    for node in literals(ast.parse(source)):
        line = lines[node.lineno - 1]
        words = set(WORD.findall(node.value))
        named = [w for w in words if w in metrics | keys or (prefixes and w.startswith(prefixes))]
        if node.value == f"eval:{suite.name}" or (node.value == suite.name and "suite" in line.lower()):
            named.append(suite.name)
        found += [f"{rel}:{node.lineno}: {sorted(named)}: {line.strip()}"] if named else []
    return found


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return {p.relative_to(PACKAGE).as_posix(): p.read_text(encoding="utf-8") for p in package_files()}


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_no_module_but_the_suites_own_names_a_suite_or_its_metrics(name: str, sources: dict[str, str]) -> None:
    suite, stages = REGISTRY[name], stage_names()
    allowed = own_modules(suite) | LISTS
    found = [h for rel, text in sources.items() if rel not in allowed for h in hits(suite, rel, text, stages)]
    assert not found, "\n".join(found)


def test_the_scan_sees_a_branch_on_a_name_and_leaves_prose_alone() -> None:
    suite, stages = REGISTRY["latency"], stage_names()
    branch = 'if suite == "latency":\n    keys = [k for k in scores if k.startswith("latency_")]\n'
    assert len(hits(suite, "x.py", branch, stages)) == 2
    assert hits(suite, "x.py", 'stage = stages.get("eval:latency")\n', stages)
    prose = '"""The latency suite: latency_ttft_ms."""\n# latency_ttft_ms\nx = "latency"\n'
    assert hits(suite, "x.py", prose, stages) == []
