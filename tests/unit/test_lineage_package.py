"""MLflow stays behind one package: ``codemill.lineage`` is the only code that imports it, and its tag names and
store check load without it (everything imports those, and an MLflow import costs a second)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import codemill

PACKAGE = Path(codemill.__file__).parent
LINEAGE = PACKAGE / "lineage"


def _imports_mlflow(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "mlflow" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "mlflow":
            return True
    return False


def test_only_the_lineage_package_imports_mlflow():
    sources = [Path(folder, name) for folder, _, names in os.walk(PACKAGE, followlinks=True)  # and the root
               for name in names if name.endswith(".py")]  # folders, through their codemill/<folder> links
    assert PACKAGE / "models" / "trainer.py" in sources
    outside = [str(p.relative_to(PACKAGE)) for p in sources if LINEAGE not in p.parents and _imports_mlflow(p)]
    assert outside == []
    assert _imports_mlflow(LINEAGE / "record.py")  # the walk does see an MLflow import where there is one


CHEAP = """
import sys
from codemill.lineage import tags
from codemill.lineage.check import absolute_tracking_uri
print(tags.STAGE, "mlflow" in sys.modules)
from codemill.lineage import Lineage
print(Lineage.__module__, "mlflow" in sys.modules)
"""


def test_tags_and_the_store_check_load_without_mlflow_and_the_writers_with_it():
    out = subprocess.run([sys.executable, "-c", CHEAP], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["codemill.stage", "False", "codemill.lineage.record", "True"]
