"""A plain fit of a small causal LM on token documents: what stands for the pretraining a base model had before
the pipeline met it (the RL tests' base policies, the repository learning check). Not a stage: the pipeline
trains with ``models.trainer`` under torchrun."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path


def fit_documents(policy: Path, out: Path, docs: Sequence[Sequence[int]], steps: int, lr: float = 3e-3,
                  batch: int = 32, seed: int = 0, on_step: Callable[[int, float], None] | None = None) -> Path:
    """``out``: ``policy`` (an HF folder) trained for ``steps`` AdamW steps (5 warmup steps, cosine to 0.1 lr) on
    ``docs`` (token ids, each ended as it should be, by EOS), ``batch`` documents a step drawn by ``seed``.
    ``on_step(step, loss)`` sees each step's loss."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(policy))
    model = AutoModelForCausalLM.from_pretrained(str(policy))
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    for step in range(steps):
        warm = min(1.0, (step + 1) / 5)
        for group in opt.param_groups:
            group["lr"] = lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
        chosen = [list(docs[i]) for i in rng.sample(range(len(docs)), min(batch, len(docs)))]
        width = max(map(len, chosen))
        ids = torch.tensor([d + [tok.pad_token_id] * (width - len(d)) for d in chosen])
        labels = torch.tensor([d + [-100] * (width - len(d)) for d in chosen])
        loss = model(input_ids=ids, attention_mask=(labels != -100).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if on_step is not None:
            on_step(step, loss.item())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out
