"""What every torchrun entrypoint here shares (the trainer and the GRPO update): JSON event lines, AdamW
parameter groups, the unsharded state dict for export, and a rank's startup (lifeline, stack dumps)."""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch

from codemill.models import lifeline, rank_errors

STACK_DUMP_ENV = "CODEMILL_STACK_DUMP_AFTER_S"


def emit(event: str, **fields) -> None:
    """One JSON line on stdout: the launcher parses these (progress, metrics, the final result)."""
    print(json.dumps({"event": event, **fields}), flush=True)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only; norms and biases are not decayed."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def full_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """Unsharded, on CPU (a collective under FSDP: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def start_rank() -> None:
    """A rank's first act: die with torchrun and with the launcher (never run on as an orphan), and, when
    ``CODEMILL_STACK_DUMP_AFTER_S`` is set, dump every thread's stack after that long (a stuck collective or a
    blocked write shows where it hangs before the kill)."""
    lifeline.arm()
    faulthandler.enable()
    dump_after = os.environ.get(STACK_DUMP_ENV)
    if dump_after:
        faulthandler.dump_traceback_later(float(dump_after), exit=False)


def run_rank(work: Callable[[], object]) -> int:
    """A torchrun worker's body: ``work()``, then, in a process group, an exit that skips Python's teardown.

    Tearing a gloo process group down from Python can deadlock: the last reference (a DDP reducer's, say) is
    dropped with the GIL held, the group's destructor joins its worker threads, and a worker is destroying a
    finished collective whose tensors need the GIL to be freed (seen here: rank 0 stuck in
    ``~ProcessGroupGloo`` -> ``thread::join`` while the gloo thread waits in ``decref_pyobject``; at interpreter
    exit the same wait aborts, SIGABRT). ``work`` ends with a barrier after every output is written and closed,
    so the rank flushes its streams and leaves with ``os._exit``; a failure prints its traceback and leaves
    with 1 (destroying the group while other ranks may sit in a collective can deadlock too), and torchrun
    stops the others. The failure is recorded first (``rank_errors``): the launcher names the job's first cause."""
    import torch.distributed as dist

    try:
        work()
    except BaseException as exc:
        rank_errors.record(exc)  # before this rank exits, which is what the others die of
        if not dist.is_initialized():
            raise
        traceback.print_exc()
        _leave(1)
    if dist.is_initialized():
        _leave(0)
    return 0


def _leave(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
