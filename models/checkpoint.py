"""Resumable checkpoints in a local work directory, committed atomically, pruned only after a commit.

A checkpoint is ``<ckpt_root>/step-XXXXXXXX/`` with ``state.pt`` (model, optimizer, scheduler, step) from rank
0 and ``rng-<rank>.pt`` from every rank. It is built under a dot-prefixed staging name and renamed into place
once every rank has written its part, so a directory named ``step-*`` is always complete.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

PREFIX = "step-"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def committed_steps(ckpt_root: Path) -> list[int]:
    if not ckpt_root.is_dir():
        return []
    steps = []
    for p in ckpt_root.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and (p / "state.pt").exists():
            steps.append(int(p.name.removeprefix(PREFIX)))
    return sorted(steps)


def step_dir(ckpt_root: Path, step: int) -> Path:
    return ckpt_root / f"{PREFIX}{step:08d}"


def staging_dir(ckpt_root: Path, step: int) -> Path:
    return ckpt_root / f".staging-{PREFIX}{step:08d}"


def write_rank_part(ckpt_root: Path, step: int, rank: int) -> None:
    staging = staging_dir(ckpt_root, step)
    staging.mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), staging / f"rng-{rank}.pt")


def commit(ckpt_root: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Rank 0, after every rank wrote its part: write state, rename into place, then prune old ones."""
    staging = staging_dir(ckpt_root, step)
    tmp = staging / "state.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, staging / "state.pt")
    final = step_dir(ckpt_root, step)
    if final.exists():
        shutil.rmtree(final)
    os.rename(staging, final)
    for old in committed_steps(ckpt_root)[:-keep]:
        shutil.rmtree(step_dir(ckpt_root, old), ignore_errors=True)
    return final


def load(ckpt_root: Path, step: int, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    d = step_dir(ckpt_root, step)
    state = torch.load(d / "state.pt", map_location="cpu", weights_only=False)
    rng = torch.load(d / f"rng-{rank}.pt", map_location="cpu", weights_only=False)
    return state, rng


def clear_staging(ckpt_root: Path) -> None:
    """Remove leftovers of checkpoints a killed run never committed."""
    if ckpt_root.is_dir():
        for p in ckpt_root.glob(f".staging-{PREFIX}*"):
            shutil.rmtree(p, ignore_errors=True)
