"""Resumable checkpoints with torch.distributed.checkpoint (DCP), committed atomically, pruned after commit.

Layout: ``<ckpt_root>/step-XXXXXXXX/`` with ``dcp/`` (model + optimizer, sharded: one file per rank),
``trainer.pt`` (scheduler, step, loss history; rank 0) and ``rank-<r>.pt`` (each rank's RNG states). It is
written under a dot-prefixed staging name and renamed into place by rank 0 only after every rank's part is
on disk, so a ``step-*`` directory is always complete. Old checkpoints are pruned only after the new one is
committed. DCP reshards on load, so a checkpoint saved by N ranks loads on M.

One trainer at a time per directory: rank 0 holds an exclusive ``flock`` on ``<ckpt_root>/.lock`` for its
whole life (the kernel drops it when the process dies, however it dies), so a second trainer started on the
same directory, say a retry beside a run that was never stopped, is refused before it deletes or writes
anything.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

PREFIX = "step-"
LOCK = ".lock"


class CheckpointDirBusy(RuntimeError):
    """Another live trainer holds the checkpoint directory."""


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
    return sorted(int(p.name.removeprefix(PREFIX)) for p in ckpt_root.iterdir()
                  if p.is_dir() and p.name.startswith(PREFIX) and (p / "trainer.pt").exists())


def step_dir(ckpt_root: Path, step: int) -> Path:
    return ckpt_root / f"{PREFIX}{step:08d}"


def staging_dir(ckpt_root: Path, step: int) -> Path:
    return ckpt_root / f".staging-{PREFIX}{step:08d}"


def clear_staging(ckpt_root: Path) -> None:
    """Remove leftovers of checkpoints a killed run never committed (only while holding the directory's lock)."""
    if ckpt_root.is_dir():
        for p in ckpt_root.glob(f".staging-{PREFIX}*"):
            shutil.rmtree(p, ignore_errors=True)


def lock_dir(ckpt_root: Path) -> int:
    """Take the directory's exclusive lock without waiting; returns the descriptor that holds it (keep it open).

    The lock file names its holder (pid, host) for the error a second trainer gets."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    fd = os.open(ckpt_root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise CheckpointDirBusy(f"checkpoint directory {ckpt_root} is in use by another trainer ({holder}); "
                                "refusing to start a second one on it") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return fd


@dataclass
class Pending:
    """A checkpoint whose shards are written (or being written asynchronously) but not yet committed."""

    step: int
    trainer_state: dict[str, Any]
    future: Any = None


class Checkpointer:
    """Saves, commits and prunes checkpoints; ``on_commit(step, trainer_state)`` runs on rank 0 once a checkpoint
    is committed (for an async save that is at the next save or at ``finish``, never before)."""

    def __init__(self, ckpt_root: Path, rank: int, keep: int, barrier, async_save: bool = False,
                 on_commit: Callable[[int, dict[str, Any]], None] | None = None) -> None:
        self.root, self.rank, self.keep, self.barrier, self.async_save = ckpt_root, rank, keep, barrier, async_save
        self.on_commit = on_commit
        self.pending: Pending | None = None
        self.protected: int | None = None  # the best checkpoint survives keep-last-k pruning
        self.lock_fd: int | None = None

    def open(self) -> None:
        """Rank 0 locks the directory (held until this process exits) and clears uncommitted staging."""
        if self.rank == 0:
            self.lock_fd = lock_dir(self.root)
            clear_staging(self.root)
        self.barrier()

    def save(self, step: int, model, optimizer, scheduler, extra: dict[str, Any]) -> None:
        self.finish()  # one checkpoint in flight at a time
        staging = staging_dir(self.root, step)
        if self.rank == 0:
            staging.mkdir(parents=True, exist_ok=True)
        self.barrier()
        torch.save(rng_state(), staging / f"rank-{self.rank}.pt")
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
        trainer_state = {"scheduler": scheduler.state_dict(), "step": step, **extra}
        if self.async_save:
            self.pending = Pending(step, trainer_state, dcp.async_save(state, checkpoint_id=str(staging / "dcp")))
        else:
            dcp.save(state, checkpoint_id=str(staging / "dcp"))
            self.pending = Pending(step, trainer_state)
            self.finish()

    def finish(self) -> Path | None:
        """Wait for the in-flight checkpoint, then commit it (rank 0 renames) and prune older ones."""
        if self.pending is None:
            return None
        p, self.pending = self.pending, None
        if p.future is not None:  # a Future, or an AsyncSaveResponse (staging + upload) in newer torch
            (p.future.upload_completion if hasattr(p.future, "upload_completion") else p.future).result()
        self.barrier()
        final = step_dir(self.root, p.step)
        if self.rank == 0:
            staging = staging_dir(self.root, p.step)
            tmp = staging / "trainer.pt.tmp"
            torch.save(p.trainer_state, tmp)
            os.replace(tmp, staging / "trainer.pt")
            if final.exists():
                shutil.rmtree(final)
            os.rename(staging, final)
            for old in committed_steps(self.root)[:-self.keep]:
                if old != self.protected:
                    shutil.rmtree(step_dir(self.root, old), ignore_errors=True)
        self.barrier()
        if self.rank == 0 and self.on_commit is not None:
            self.on_commit(p.step, p.trainer_state)
        return final

    def load_model_only(self, step: int, model) -> None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=str(step_dir(self.root, step) / "dcp"))
        set_model_state_dict(model, state["model"])

    def load(self, step: int, model, optimizer, scheduler) -> dict[str, Any]:
        d = step_dir(self.root, step)
        msd, osd = get_state_dict(model, optimizer)
        state: dict[str, Any] = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=str(d / "dcp"))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        trainer_state = torch.load(d / "trainer.pt", map_location="cpu", weights_only=False)
        scheduler.load_state_dict(trainer_state["scheduler"])
        rank_file = d / f"rank-{self.rank}.pt"
        if rank_file.exists():  # absent when resuming on more ranks than saved
            set_rng_state(torch.load(rank_file, map_location="cpu", weights_only=False))
        return trainer_state
