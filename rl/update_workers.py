"""Long-lived GRPO update workers: one torchrun group per RL run, not one per iteration.

Launching torchrun for every update costs each iteration the interpreter start, the torch and transformers
imports, the rendezvous and the policy load of every rank (about 6 s of an 11 s iteration of the tiny preset
on 2 cores). ``UpdateWorkers`` starts the group once (``python -m torch.distributed.run ... -m
codemill.rl.update_workers CONTROL_DIR``) and hands it one update at a time; the ranks keep the policy and its
AdamW state in memory between updates (``rl.update.KeptPolicy``), so the update of iteration i + 1 starts from
what iteration i trained without reading it back.

Each update still writes everything the one-shot job writes (the exported policy, its optimizer checkpoint,
the resume checkpoints): the artifacts are committed per iteration, a killed run resumes from them exactly, and
an update served here computes the same bytes as ``codemill.rl.update`` on the same inputs.

Protocol (files, so that no rank blocks in a collective while the next rollouts are generated, which may take
longer than a collective's timeout): the client writes ``request-<n>.json`` (a ``WorkerRequest``) atomically
into the control folder; every rank polls for it, runs the update, and rank 0 prints ``{"event": "served",
"seq": n}`` once every rank is through. ``stop`` in the folder ends the group. A failing update ends the group
too (its ranks may sit in different collectives): the client raises the error and the next update starts a
fresh group, from the artifacts on disk. The ranks die with the client process (``models.lifeline``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from codemill.models.common import STACK_DUMP_ENV, emit, run_rank, start_rank
from codemill.models.launch import LaunchedJob, TrainingFailed, torchrun_command
from codemill.rl.update import KeptPolicy, RLUpdateSpec

MODULE = "codemill.rl.update_workers"
STOP = "stop"
POLL_S = 0.02


class WorkerRequest(BaseModel):
    """One update for the workers: the spec the one-shot job would get, the key of the policy it starts from and
    the key its export will be known by (artifact digests: a worker holding ``policy_key`` in memory continues
    from there)."""

    model_config = ConfigDict(extra="forbid")

    seq: int = Field(ge=0)
    spec: RLUpdateSpec
    policy_key: str
    output_key: str
    timeout_s: float = Field(gt=0)


def request_path(control: Path, seq: int) -> Path:
    return control / f"request-{seq:06d}.json"


def wait_for_request(control: Path, seq: int) -> WorkerRequest | None:
    """The ``seq``-th request, polled for; None once the folder says stop."""
    path = request_path(control, seq)
    while True:
        if path.exists():
            return WorkerRequest.model_validate_json(path.read_text())
        if (control / STOP).exists():
            return None
        time.sleep(POLL_S)


def serve(control: Path) -> None:
    """A rank's life: updates in order until stop, each on the one training loop, the last one's policy kept for
    the next."""
    from codemill.models.trainer import Trainer
    from codemill.rl.update import PolicyFolders, grpo_update

    kept: KeptPolicy | None = None
    seq = 0
    d = None
    while (request := wait_for_request(control, seq)) is not None:
        faulthandler.dump_traceback_later(max(1.0, request.timeout_s - 15), exit=False)
        policy = PolicyFolders(request.spec, kept if kept is not None and kept.key == request.policy_key else None)
        trainer = Trainer(grpo_update(request.spec, policy))
        trainer.run()
        kept = policy.keep(request.output_key)
        d = trainer.d
        del trainer, policy
        faulthandler.cancel_dump_traceback_later()
        if d.rank == 0:
            emit("served", seq=seq)
        seq += 1
    if d is not None:
        d.barrier()


class UpdateWorkers:
    """The client: starts the group, hands it updates one at a time, stops it. ``on_line`` of each ``run`` gets
    the group's output lines while that update runs (progress, the done line)."""

    def __init__(self, nproc_per_node: int, control: Path, env: dict[str, str]) -> None:
        self.nproc_per_node, self.control = nproc_per_node, control
        control.mkdir(parents=True, exist_ok=True)
        for stale in control.iterdir():
            stale.unlink()
        self.seq = 0
        self._lock = threading.Lock()  # one update at a time, whichever thread asks
        self._on_line: Callable[[str], None] = lambda line: None
        self._served = -1
        cmd = torchrun_command(str(control), nproc_per_node, module=MODULE)
        env = {k: v for k, v in env.items() if k != STACK_DUMP_ENV}  # armed per update instead
        self.job = LaunchedJob(cmd, env, self._line)

    def _line(self, line: str) -> None:
        if line.startswith('{"event": "served"'):
            self._served = int(json.loads(line)["seq"])
            return
        self._on_line(line)

    def alive(self) -> bool:
        return self.job.alive()

    def run(self, spec: RLUpdateSpec, policy_key: str, output_key: str, timeout_s: float,
            on_line: Callable[[str], None]) -> None:
        """One update, blocking until the group has served it. A failure or a timeout stops the group and raises
        ``TrainingFailed`` with its last output."""
        with self._lock:
            self._run(spec, policy_key, output_key, timeout_s, on_line)

    def _run(self, spec: RLUpdateSpec, policy_key: str, output_key: str, timeout_s: float,
             on_line: Callable[[str], None]) -> None:
        seq = self.seq
        self._on_line = on_line
        request = WorkerRequest(seq=seq, spec=spec, policy_key=policy_key, output_key=output_key,
                                timeout_s=timeout_s)
        staging = self.control / f".request-{seq:06d}.json"
        staging.write_text(request.model_dump_json())
        os.rename(staging, request_path(self.control, seq))
        self.seq += 1
        try:
            rc = self.job.wait(until=lambda: self._served >= seq, timeout_s=timeout_s)
        except TimeoutError:
            self.job.stop()
            raise TrainingFailed(f"update timed out after {timeout_s:.0f}s; killed. Last output:\n"
                                 + "\n".join(self.job.tail), self.job.tail) from None
        except BaseException:
            self.job.stop()
            raise
        finally:
            self._on_line = lambda line: None
        if rc is not None:
            failed = self.job.failure(f"the update workers exited with code {rc}")
            self.job.close_lifeline()
            raise failed

    def close(self, grace_s: float = 30) -> None:
        """Ask the group to stop after its current update; kill it if it has not within ``grace_s``."""
        if self.job.alive():
            (self.control / STOP).touch()
            with contextlib.suppress(TimeoutError):
                self.job.wait(timeout_s=grace_s)
        self.job.stop()
        shutil.rmtree(self.control, ignore_errors=True)


_live: dict[str, Any] = {}
_live_lock = threading.RLock()


def live_workers(key: str, start: Callable[[], UpdateWorkers]) -> UpdateWorkers:
    """The process's running group for ``key`` (its launch settings), started (and any other one stopped) when
    there is none or it died."""
    with _live_lock:
        workers = _live.get("workers")
        if workers is not None and (_live.get("key") != key or not workers.alive()):
            close_live_workers()
            workers = None
        if workers is None:
            workers = start()
            _live.update(workers=workers, key=key)
        return workers


def close_live_workers() -> None:
    """Stop the running group, if any (the rl flow's end)."""
    with _live_lock:
        workers = _live.pop("workers", None)
        _live.pop("key", None)
        if workers is not None:
            workers.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m {MODULE} CONTROL_DIR", file=sys.stderr)
        return 2
    start_rank()
    return run_rank(lambda: serve(Path(argv[0])))


if __name__ == "__main__":
    raise SystemExit(main())
