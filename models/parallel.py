"""Process group, device and the DDP / FSDP2 wrapping of the model."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def setup(device_pref: str) -> Dist:
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = device_pref == "cuda" or (device_pref == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Dist(rank, world, local_rank, device)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a transformers causal LM (Llama-style ``model.model.layers``, peft-aware)."""
    get_base = getattr(model, "get_base_model", None)  # a peft model wraps the transformers one
    base = get_base() if callable(get_base) else model
    inner = getattr(base, "model", base)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(base).__name__} for FSDP")
    return list(layers)


def wrap(model: torch.nn.Module, kind: str, d: Dist, bf16: bool) -> torch.nn.Module:
    """DDP (replicated) or FSDP2 (``fully_shard`` per block, then the root; bf16 params / fp32 reduce on GPU).

    Create the optimizer after this: FSDP2 replaces parameters with sharded DTensors.
    """
    if kind == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(d.device.type, (d.world,))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if bf16 and d.device.type == "cuda" else MixedPrecisionPolicy())
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model
    if d.distributed:
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[d.local_rank] if d.device.type == "cuda"
                                                         else None)
    return model


def set_grad_sync(module: torch.nn.Module, kind: str, sync: bool):
    """Context for a micro-step: skip gradient all-reduce on all but the last micro-step of a step."""
    from contextlib import nullcontext

    if kind == "fsdp":
        cast("FSDPModule", module).set_requires_gradient_sync(sync)  # wrap() applied fully_shard
        return nullcontext()
    if isinstance(module, torch.nn.parallel.DistributedDataParallel) and not sync:
        return module.no_sync()
    return nullcontext()


def as_float(x) -> float:
    """A scalar that may be a DTensor (FSDP2 grad norm)."""
    full = getattr(x, "full_tensor", None)
    return float(full() if full else x)
