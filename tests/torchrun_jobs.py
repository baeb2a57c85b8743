"""Tiny torchrun entrypoints for the launcher's tests (``python -m torch.distributed.run ... -m
tests.torchrun_jobs MODE``), run through ``run_rank`` as the trainer's ranks are.

``sum:<offset>``: a gloo all-reduce of ``rank + offset``; rank 0 prints the sum and the port its group met on.
``die-first``: rank 0 fails with ``FirstFailure``; rank 1, waiting in a barrier, dies of rank 0's exit (gloo's
connection error) and prints that echo last, as a trainer's other ranks do when rank 0 finds its checkpoint
folder busy.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
import torch.distributed as dist

from codemill.models.common import run_rank, start_rank


class FirstFailure(RuntimeError):
    """What rank 0 of ``die-first`` dies of."""


def summed(offset: int) -> None:
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + offset)])
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        print(json.dumps({"event": "sum", "sum": total.item(), "port": int(os.environ["MASTER_PORT"])}), flush=True)
    dist.barrier()


def die_first() -> None:
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:  # lives to print its own error: torchrun's stop signal does not cut it short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.barrier()
    if dist.get_rank() == 0:
        raise FirstFailure("rank 0 found its checkpoint folder held by another trainer")
    dist.barrier()  # rank 1: rank 0 is gone


def main() -> int:
    start_rank()
    mode = sys.argv[1]
    if mode == "die-first":
        return run_rank(die_first)
    return run_rank(lambda: summed(int(mode.removeprefix("sum:"))))


if __name__ == "__main__":
    sys.exit(main())
