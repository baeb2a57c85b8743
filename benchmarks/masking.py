"""Document masking: FlexAttention with a block mask against SDPA with the dense [B, 1, T, T] mask, same run.

    python -m benchmarks.masking [--seq-len 256] [--micro-batch 8] [--doc-len 128] [--repeats 7]

Same weights and packed rows (positions as ``codemill.data.pack`` writes them) through transformers'
``flex_attention`` (torch.compile'd) and ``sdpa``, interleaved; prints the median time of each (mask
construction included, as the trainer pays it per micro-batch), their ratio, the flex path's first-call
(compile) time, and the largest loss difference. On CUDA a step is forward + backward in bf16 autocast, the
training path; on CPU it is forward only (fp32, no grad): torch 2.13 has no FlexAttention backward on CPU,
which is why CPU training keeps the dense mask. Model: the tiny preset's (or --size 125m).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from codemill.data.pack import positions_from_starts
from codemill.models.batches import model_inputs
from codemill.models.build import build_model
from codemill.models.config import ModelConfig
from codemill.models.masking import FLEX, SDPA

SIZES = {
    "tiny": ModelConfig(hidden_size=128, intermediate_size=344, num_layers=4, num_heads=4, num_kv_heads=4),
    "125m": ModelConfig(hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12, num_kv_heads=12),
}
VOCAB = 4096


def timed(fn: Callable[[], float], device: torch.device) -> tuple[float, float]:
    """(seconds, loss) of one call, synchronised on CUDA."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--doc-len", type=int, default=128, help="mean packed document length in tokens")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train = device.type == "cuda"
    rng = np.random.default_rng(0)
    pos = torch.from_numpy(positions_from_starts(rng.random((args.micro_batch, args.seq_len)) < 1 / args.doc_len))
    pos = pos.to(torch.int64).to(device)
    tokens = torch.from_numpy(rng.integers(2, VOCAB, size=pos.shape)).to(device)
    with device:
        model = build_model(SIZES[args.size], VOCAB, args.seq_len, 0, 1, seed=0)
    model.train(train)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if train else contextlib.nullcontext()

    def step(impl: str) -> Callable[[], float]:
        def run() -> float:
            model.set_attn_implementation(impl)
            with torch.set_grad_enabled(train), autocast:
                loss = model(**model_inputs(tokens, pos, impl)).loss
                if train:
                    loss.backward()
            model.zero_grad(set_to_none=True)
            return float(loss)
        return run

    first_flex, _ = timed(step(FLEX), device)  # compiles FlexAttention (and, on CUDA, the block mask builder)
    timed(step(SDPA), device)
    times: dict[str, list[float]] = {SDPA: [], FLEX: []}
    losses: dict[str, list[float]] = {SDPA: [], FLEX: []}
    for _ in range(args.repeats):
        for impl in (SDPA, FLEX):
            t, loss = timed(step(impl), device)
            times[impl].append(t)
            losses[impl].append(loss)
    dense, flex = statistics.median(times[SDPA]), statistics.median(times[FLEX])
    diff = max(abs(a - b) for a, b in zip(losses[SDPA], losses[FLEX], strict=True))
    what = "forward + backward, bf16 autocast" if train else "forward only, fp32 (no FlexAttention backward on CPU)"
    print(f"torch {torch.__version__}, {device}, threads {torch.get_num_threads()}; {args.size} model, micro batch "
          f"{args.micro_batch} x {args.seq_len} tokens, documents of mean {args.doc_len}; {what}")
    print(f"{'sdpa + dense mask (reference)':<34} {dense * 1e3:>9.1f} ms")
    print(f"{'flex_attention + block mask':<34} {flex * 1e3:>9.1f} ms   {flex / dense:.2f}x the reference")
    print(f"flex first call (compile) {first_flex:.1f} s; max |loss difference| {diff:.2e}")


if __name__ == "__main__":
    main()
