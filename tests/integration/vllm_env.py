"""The vLLM environment for the tests: built once by ``scripts/vllm-env`` and cached outside the repository, keyed
by what decides its contents (constraints-vllm.txt, pyproject.toml, the script), so a later session or CI run
reuses it. The vLLM side of a test runs as a script under that environment's python, with this checkout first on
``PYTHONPATH`` (the cached environment's editable codemill may point at another checkout), and answers in JSON.
It runs in a session of its own, so no signal vLLM sends to its process group reaches the test process."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
KEY_FILES = ("constraints-vllm.txt", "pyproject.toml", "scripts/vllm-env")
DONE = ".codemill-complete"
# vLLM's CPU backend: a 1 GiB KV cache (the default takes more), and OpenMP threads not pinned to cores (the
# machine's cores are shared).
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def env_key() -> str:
    h = hashlib.sha256()
    for name in KEY_FILES:
        h.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
    return h.hexdigest()[:12]


def cache_root() -> Path:
    return Path(os.environ.get("CODEMILL_CACHE", Path.home() / ".cache" / "codemill"))


def vllm_python() -> Path:
    """The cached environment's python, built first when missing (under a lock: concurrent runs build it once).
    A failed build raises with pip's output."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    env = root / f"venv-vllm-{env_key()}"
    with open(root / f"venv-vllm-{env_key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (env / DONE).exists():
            shutil.rmtree(env, ignore_errors=True)  # a build that died half way
            out = subprocess.run([str(ROOT / "scripts" / "vllm-env"), str(env)], cwd=ROOT, capture_output=True,
                                 text=True, timeout=1800)
            if out.returncode != 0:
                raise RuntimeError(f"scripts/vllm-env {env} failed ({out.returncode}):\n{out.stdout[-4000:]}\n"
                                   f"{out.stderr[-8000:]}")
            (env / DONE).write_text(env_key())
    return env / "bin" / "python"


def script_env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "VIRTUAL_ENV"))}
    return {**base, **CPU_ENV, "PYTHONPATH": str(ROOT), **extra}


def run_json(python: Path, script: Path, args: dict[str, Any], out: Path, timeout: float = 900) -> dict[str, Any]:
    """``python script args.json out.json``; the result, or the script's output in the failure."""
    args_file = out.with_suffix(".args.json")
    args_file.write_text(json.dumps(args))
    proc = subprocess.run([str(python), str(script), str(args_file), str(out)], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=timeout, start_new_session=True)
    if proc.returncode != 0 or not out.exists():
        raise AssertionError(f"{script.name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(out.read_text())
