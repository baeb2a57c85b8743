"""The wheel installs the root folders under one import name, codemill.*, and nothing at top level."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-w", str(tmp / "dist"), "-q"],
                   check=True, timeout=300)
    (wheel,) = (tmp / "dist").glob("codemill-*.whl")
    target = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel), "-q"],
                   check=True, timeout=300)
    return target


def test_only_codemill_at_top_level(installed_wheel):
    top = {p.name for p in installed_wheel.iterdir() if not p.name.endswith(".dist-info") and p.name != "bin"}
    assert top == {"codemill"}
    for sub in ("data", "models", "evals", "gate", "rl", "rl/algorithms", "sandbox", "problems", "problems/plus",
                "repos", "tasks", "flows", "configs"):
        init = installed_wheel / "codemill" / sub / "__init__.py"
        assert init.is_file() and not init.parent.is_symlink(), sub  # the files, not the checkout's symlinks
    assert (installed_wheel / "codemill" / "configs" / "tiny.yaml").exists()
    assert (installed_wheel / "codemill" / "repos" / "report_plugin.py").exists()  # copied into test environments
    assert (installed_wheel / "codemill" / "py.typed").exists()  # PEP 561: type checkers read the inline hints
    shipped = sorted(p.name for p in (installed_wheel / "codemill" / "problems" / "plus" / "shipped").glob("*.zip"))
    assert shipped == sorted(p.name for p in (REPO / "problems" / "plus" / "shipped").glob("*.zip")) != []


def test_import_codemill_data_from_the_wheel(installed_wheel):
    # -S: no .pth files, so the checkout's editable install cannot supply a module the wheel lacks.
    site = sysconfig.get_paths()["purelib"]
    code = (f"import sys; sys.path.insert(0, {str(installed_wheel)!r}); sys.path.append({site!r}); "
            "import codemill.data, codemill.config, codemill.sandbox; print(codemill.data.__file__); "
            "print(codemill.sandbox.__file__); print(codemill.config.load_preset('tiny').train.nproc_per_node)")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    *paths, nproc = out.stdout.split()
    assert all(p.startswith(str(installed_wheel)) for p in paths) and nproc == "2", out.stdout
    bare = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:] = [{str(installed_wheel)!r}]; "
                           "import data"], capture_output=True, text=True, cwd="/")
    assert bare.returncode != 0 and "No module named 'data'" in bare.stderr
