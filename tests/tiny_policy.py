"""A tiny HF policy folder (Llama weights + a BPE tokenizer trained on the synthetic problems) for rollout tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


def make_policy(root: Path, seed: int = 0, vocab_size: int = 400, max_len: int = 512, model_config=None) -> Path:
    """``root/hf``: an untrained model whose samples are varied (random weights) and end on EOS now and then.
    ``model_config`` (a ModelConfig) defaults to a 2-layer, 64-wide model."""
    from codemill.config import ModelConfig
    from codemill.evals.synthetic import synthetic_problems
    from codemill.models.build import scratch_policy

    texts = [p.prompt + (p.reference_solution or "") for p in synthetic_problems(0, 60)]
    small = ModelConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2)
    return scratch_policy(root, texts, vocab_size, model_config or small, max_len, seed)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch on ``n`` threads, then restore the count: on a shared 2-core machine two spinning OpenMP threads
    make the tiny model's small ops about 10x slower than one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)

