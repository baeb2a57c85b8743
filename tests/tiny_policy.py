"""A tiny HF policy folder (Llama weights + a BPE tokenizer trained on the synthetic problems) for rollout tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


def make_policy(root: Path, seed: int = 0, vocab_size: int = 400, max_len: int = 512, model_config=None,
                split_digits: bool = False) -> Path:
    """``root/hf``: an untrained model whose samples are varied (random weights) and end on EOS now and then.
    ``model_config`` (a ModelConfig) defaults to a 2-layer, 64-wide model."""
    from codemill.models.build import scratch_policy
    from codemill.models.config import ModelConfig
    from codemill.problems.synthetic import synthetic_problems

    texts = [p.prompt + (p.reference_solution or "") for p in synthetic_problems(0, 60)]
    small = ModelConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2)
    return scratch_policy(root, texts, vocab_size, model_config or small, max_len, seed, split_digits)


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


def pretrain_policy(policy: Path, out: Path, pairs: list[tuple[str, str]], steps: int, lr: float = 3e-3,
                    batch: int = 32, seed: int = 0) -> Path:
    """``out``: ``policy`` trained for ``steps`` AdamW steps (5 warmup steps, cosine to 0.1 lr) on (prompt,
    completion) documents, each encoded in two parts as a rollout sees them and ended by EOS. A plain loop: this
    stands for the pretraining a base model had before the pipeline met it, not for anything the pipeline does.
    (Not ``models.schedule.cosine_with_warmup``: with that schedule the base model came out stronger, held-out
    0.71 rather than 0.66 before GRPO, and the tests' gains shrank to +0.07, p = 0.005 and 0.016.)"""
    from transformers import AutoTokenizer

    from codemill.models.fit import fit_documents
    from codemill.rl.data import solution_documents

    tok = AutoTokenizer.from_pretrained(str(policy))
    docs = [d + [tok.eos_token_id] for d in solution_documents(pairs, tok)]
    return fit_documents(policy, out, docs, steps, lr, batch, seed)
