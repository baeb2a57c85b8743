"""Batched generation with a KV cache, stop sequences, greedy or nucleus sampling.

Two entry points share one batching loop (``_generate_batches``: left padding, the per-batch seed, HF
``generate`` with its KV cache): ``generate`` takes text prompts and returns text cut at stop strings;
``generate_ids`` takes token-id prompts (built by the caller, e.g. a fill-in-the-middle layout with sentinel
ids) and returns each row's new ids up to its first stop id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
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


def cut_at_ids(ids: Sequence[int], stop_ids: Sequence[int]) -> list[int]:
    """``ids`` up to (not including) the first stop id."""
    stops = set(stop_ids)
    return next(([*ids[:i]] for i, t in enumerate(ids) if t in stops), list(ids))


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


def _generate_batches(model, prompts: Sequence[list[int]], params: SamplingParams, *, batch_size: int,
                      pad_id: int, eos_ids: int | list[int], device: torch.device, seed: int,
                      stopping: Callable[[int], list] | None = None) -> Iterator[torch.Tensor]:
    """Each batch's new tokens (rows left-padded to one width; a row that stopped early is padded with
    ``pad_id``). ``stopping(width)``: extra stopping criteria for a batch whose prompts are ``width`` wide."""
    from transformers import StoppingCriteriaList

    gen = torch.Generator(device="cpu").manual_seed(seed)
    for start in range(0, len(prompts), batch_size):
        enc = prompts[start:start + batch_size]
        width = max(len(e) for e in enc)
        ids = torch.full((len(enc), width), pad_id, dtype=torch.long)
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
            top_k=None, use_cache=True, pad_token_id=pad_id, eos_token_id=eos_ids,
            stopping_criteria=StoppingCriteriaList(stopping(width) if stopping else []))
        yield result[:, width:]


@torch.no_grad()
def generate(model, tokenizer, prompts: Sequence[str], params: SamplingParams, *, batch_size: int,
             max_context: int, device: torch.device, seed: int = 0) -> list[str]:
    """One completion per prompt (repeat prompts for n samples). Prompts are left-truncated to fit."""
    tokenizer.padding_side = "left"
    budget = max(1, max_context - params.max_new_tokens)
    enc = [tokenizer(p, add_special_tokens=False)["input_ids"][-budget:] for p in prompts]
    out: list[str] = []
    for new in _generate_batches(model, enc, params, batch_size=batch_size, pad_id=tokenizer.pad_token_id,
                                 eos_ids=tokenizer.eos_token_id, device=device, seed=seed,
                                 stopping=lambda width: [_StopOnStrings(tokenizer, width, params.stop)]):
        out.extend(truncate_at(t, params.stop) for t in tokenizer.batch_decode(new, skip_special_tokens=True))
    return out


@torch.no_grad()
def generate_ids(model, prompts: Sequence[list[int]], params: SamplingParams, *, stop_ids: Sequence[int],
                 pad_id: int, batch_size: int, device: torch.device, seed: int = 0) -> list[list[int]]:
    """One continuation per id prompt, used as given (the caller fits it to the context): each row's new ids
    up to its first id in ``stop_ids`` (which ends generation for that row), or ``max_new_tokens`` of them.
    ``params.stop`` (strings) is not used here."""
    if not stop_ids:
        raise ValueError("generate_ids needs at least one stop id")
    out: list[list[int]] = []
    for new in _generate_batches(model, prompts, params, batch_size=batch_size, pad_id=pad_id,
                                 eos_ids=list(stop_ids), device=device, seed=seed):
        out.extend(cut_at_ids(row, stop_ids) for row in new.tolist())
    return out
