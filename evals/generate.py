"""Batched generation with a KV cache, stop sequences, greedy or nucleus sampling."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()


def truncate_at(text: str, stops: Sequence[str]) -> str:
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


class _StopOnStrings:
    """Stops generation once every row's new text contains a stop sequence (checked every few steps)."""

    def __init__(self, tokenizer, prompt_len: int, stops: Sequence[str], every: int = 8) -> None:
        self.tok, self.prompt_len, self.stops, self.every = tokenizer, prompt_len, stops, every
        self.calls = 0

    def __call__(self, input_ids: torch.Tensor, scores=None, **kwargs) -> torch.Tensor:
        self.calls += 1
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if not self.stops or self.calls % self.every:
            return done
        texts = self.tok.batch_decode(input_ids[:, self.prompt_len:], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stops) for t in texts], device=input_ids.device)


@torch.no_grad()
def generate(model, tokenizer, prompts: Sequence[str], params: SamplingParams, *, batch_size: int,
             max_context: int, device: torch.device, seed: int = 0) -> list[str]:
    """One completion per prompt (repeat prompts for n samples). Prompts are left-truncated to fit."""
    from transformers import StoppingCriteriaList

    tokenizer.padding_side = "left"
    out: list[str] = []
    budget = max(1, max_context - params.max_new_tokens)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start:start + batch_size])
        enc = [tokenizer(p, add_special_tokens=False)["input_ids"][-budget:] for p in chunk]
        width = max(len(e) for e in enc)
        ids = torch.full((len(enc), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, e in enumerate(enc):
            if e:
                ids[row, width - len(e):] = torch.tensor(e)
                mask[row, width - len(e):] = 1
        ids, mask = ids.to(device), mask.to(device)
        sample = params.temperature > 0
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        result = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=params.max_new_tokens, do_sample=sample,
            temperature=params.temperature if sample else None, top_p=params.top_p if sample else None,
            top_k=None, use_cache=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            stopping_criteria=StoppingCriteriaList([_StopOnStrings(tokenizer, width, params.stop)]))
        texts = tokenizer.batch_decode(result[:, width:], skip_special_tokens=True)
        out.extend(truncate_at(t, params.stop) for t in texts)
    return out
