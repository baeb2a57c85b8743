"""Rollout engines: k sampled completions per prompt, with the sampling policy's per-token log-probs.

The interface (``RolloutEngine``) is what the RL loop needs from a generator and nothing more: ``generate``
(k samples per prompt under ``RolloutParams``, one seed per prompt) and ``load_weights`` (weight sync after an
update). ``HFEngine`` is the built-in engine on transformers; ``VLLMEngine`` uses vLLM (the ``vllm`` extra, in an
environment of its own: ``scripts/vllm-env``). ``build_engine`` makes the one ``rl.rollout.engine`` names.

**Log-prob convention** (``docs/rl.md#log-prob-convention``): the log-prob of a sampled token is
``log_softmax(logits.float() / temperature)[token]`` over the model's raw logits at that position, before top-p
truncation, in fp32. The GRPO update recomputes the current policy's log-probs the same way (see
``teacher_forced_logprobs``), so the importance ratio is exactly 1 before the first optimizer step.

**Determinism**: every sample draws its randomness from a generator of its own, seeded from (prompt seed, sample
index) (``sample_seed``): a sample's tokens do not depend on which other prompts share its batch, the order
batches run in, or which worker runs them. Batches that are the same (the same prompts in the same order) give
bit-identical results; a different grouping changes only float rounding in the logits (the padded shapes differ).

**Weights after an update** (``load_weights(hf_dir)``): the update writes the new policy as an HF folder
(``save_pretrained`` model + tokenizer). ``HFEngine`` loads that folder's weights into its model in place.
``VLLMEngine`` streams the folder's safetensors into the running engine's workers through a worker extension
(``collective_rpc`` -> the worker's in-place ``reload_weights``), then drops the prefix cache (its KV entries
were computed with the old weights). A bare ``model_runner.model.load_weights``, the older RLHF examples'
pattern, skips the processing vLLM applies to weights after loading. Rebuilding the ``LLM`` from the folder also
works but pays the engine start (memory profiling, CUDA graphs on a GPU) every iteration.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from codemill.rl.config import RolloutConfig

FINISH_REASONS = ("stop", "eos", "length")


@dataclass(frozen=True)
class RolloutParams:
    """How to sample (like vLLM's SamplingParams). ``temperature=0`` is greedy decoding: the most likely token at
    every step (ties: the lowest id), ``top_p`` and the seeds have no effect, and the recorded log-probs are at
    temperature 1 (``logprob_temperature``). RL samples (temperature > 0); greedy is for checks and evaluation."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()  # tokens that end a sample besides EOS (included, finish_reason "stop")

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not s for s in self.stop):
            raise ValueError("stop sequences must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logprob_temperature(temperature: float) -> float:
    """The temperature the log-probs are computed at: the sampling temperature, or 1 for greedy decoding (the
    model's own distribution, where the chosen token is the most likely)."""
    return temperature if temperature > 0 else 1.0


@dataclass(frozen=True)
class Completion:
    """One sample. ``completion_ids`` are the tokens trained on: up to and including the one that completed a stop
    sequence or was EOS; ``text`` is their decoded text cut at the first stop (stop excluded)."""

    text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "eos" | "length"


@runtime_checkable
class RolloutEngine(Protocol):
    """A generator the RL loop can drive. ``generate_ids`` is token in, token out: ``k`` completions per context
    of token ids, in context order, ``seeds[i]`` fixing context i's samples whatever else is in the call; a
    multi-turn episode's context is the tokens it sampled and observed so far, never re-rendered text.
    ``generate`` encodes text prompts (``encode_prompt``) and calls it."""

    tokenizer: Any
    max_context: int

    def generate(self, prompts: Sequence[str], k: int, params: RolloutParams,
                 seeds: Sequence[int]) -> list[list[Completion]]: ...

    def generate_ids(self, contexts: Sequence[Sequence[int]], k: int, params: RolloutParams,
                     seeds: Sequence[int]) -> list[list[Completion]]: ...

    def load_weights(self, hf_dir: str | Path) -> None: ...


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any values (a hash, so nearby inputs give unrelated streams)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def sample_seed(prompt_seed: int, sample: int) -> int:
    return derive_seed("sample", prompt_seed, sample)


def truncate_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut at the first occurrence of any stop, and whether one occurred."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


def sample_from(logp: torch.Tensor, top_p: float, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling of one token per row from ``exp(logp)`` (rows: (B, V) fp32 log-probs at the sampling
    temperature), restricted to the top-p nucleus (the smallest set of most likely tokens whose mass reaches
    ``top_p``; ties broken by token id). ``uniforms`` (B,) in [0, 1) are the rows' own draws."""
    probs = logp.exp()
    if top_p >= 1.0:
        order = None
        sorted_probs = probs
    else:
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
        before = sorted_probs.cumsum(-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
    cdf = sorted_probs.cumsum(-1)
    target = (uniforms.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)
    # A target past the last non-zero entry (rounding) would land on a zero-probability token: step back to it.
    idx = torch.where(sorted_probs.gather(-1, idx) > 0, idx, (cdf < cdf[:, -1:]).sum(-1, keepdim=True))
    return (idx if order is None else order.gather(-1, idx)).squeeze(-1)


@torch.no_grad()
def teacher_forced_logprobs(model: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                            temperature: float) -> list[float]:
    """The contract's log-probs of ``completion_ids`` after ``prompt_ids``, from one unpadded forward pass (what the
    update computes); the reference the engines are tested against."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    logp = torch.log_softmax(logits / logprob_temperature(temperature), dim=-1)
    return logp.gather(-1, torch.tensor(list(completion_ids), device=device).unsqueeze(-1)).squeeze(-1).tolist()


def _eos_ids(tokenizer: Any, model: Any) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    cfg = getattr(model, "generation_config", None)
    extra = getattr(cfg, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, list):
        ids.update(int(i) for i in extra)
    return ids


def check_contexts(contexts: Sequence[Sequence[int]], seeds: Sequence[int], max_context: int,
                   max_new_tokens: int) -> None:
    """Token-in generation takes contexts as they are (no truncation: that would change what an episode saw), so
    each must leave ``max_new_tokens`` of the context; the rollout loop ends an episode before it would not."""
    if len(seeds) != len(contexts):
        raise ValueError(f"{len(contexts)} contexts but {len(seeds)} seeds")
    for c in contexts:
        if not c:
            raise ValueError("a context without tokens")
        if len(c) + max_new_tokens > max_context:
            raise ValueError(f"a context of {len(c)} tokens + {max_new_tokens} new tokens exceeds the engine's "
                             f"context of {max_context}")


def encode_prompt(tokenizer: Any, prompt: str, max_context: int, max_new_tokens: int) -> list[int]:
    """A prompt's token ids, left-truncated to leave ``max_new_tokens`` of the context: both engines encode
    prompts this one way, so they sample from the same tokens."""
    budget = max(1, max_context - max_new_tokens)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"][-budget:]
    if not ids:
        raise ValueError(f"prompt {prompt[:40]!r} encodes to no tokens")
    return list(ids)


@functools.cache
def _preallocated_layer() -> type:
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A ``DynamicLayer`` that writes each step's keys and values into a buffer sized for the whole
        generation and hands attention a view of the filled part: the same values ``torch.cat`` would build,
        without copying the whole cache at every step (which made the copy, not the model, the cost of
        sampling from a small model)."""

        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity = capacity

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            super().lazy_initialization(key_states, value_states)
            b, h, _, d = key_states.shape
            self._k = key_states.new_empty((b, h, self.capacity, d))
            self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
            self._len = 0

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self._len + key_states.shape[-2]
            if end > self.capacity:
                raise RuntimeError(f"KV cache of {self.capacity} positions overflows at {end}")
            self._k[:, :, self._len:end] = key_states
            self._v[:, :, self._len:end] = value_states
            self._len = end
            self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
            return self.keys, self.values

        def select_rows(self, rows: torch.Tensor) -> None:
            """Row ``i`` becomes a copy of row ``rows[i]``: one prefill's keys and values handed to every row
            that shares its prompt (the filled positions copied into fresh buffers of the same capacity)."""
            if not self.is_initialized:
                return
            k = self._k.new_empty((len(rows), *self._k.shape[1:]))
            v = self._v.new_empty((len(rows), *self._v.shape[1:]))
            k[:, :, :self._len] = self._k[:, :, :self._len].index_select(0, rows)
            v[:, :, :self._len] = self._v[:, :, :self._len].index_select(0, rows)
            self._k, self._v = k, v
            self.keys, self.values = k[:, :, :self._len], v[:, :, :self._len]

    return PreallocatedLayer


def preallocated_cache(model: Any, capacity: int) -> Any | None:
    """A KV cache of ``capacity`` positions per row, filled in place, for a model whose layers all use the
    plain dynamic cache (None otherwise: the model's own cache is used)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 - a config the cache cannot read: use the model's default cache
        return None
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [_preallocated_layer()(capacity) for _ in cache.layers]
    return cache


class HFEngine:
    """Batched sampling on a transformers causal LM: left padding, a KV cache, one forward per new token.

    Its own loop rather than ``model.generate``: each row samples from its own generator (``sample_seed``), the
    stop check runs on every token (so ``completion_ids`` end exactly at the token that completed the stop), and
    the log-probs come from the same fp32 logits the token was drawn from. ``rows_per_forward`` caps how many
    rows (prompts x k) share one forward pass; prompts are left-truncated to fit the context."""

    def __init__(self, policy_dir: str | Path, *, device: str | torch.device = "cpu", rows_per_forward: int = 64,
                 max_context: int | None = None, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoTokenizer

        self.device = torch.device(device)
        self.dtype = dtype
        self.policy_dir = str(policy_dir)
        self._setup(AutoTokenizer.from_pretrained(str(policy_dir)), self._load_model(policy_dir), rows_per_forward,
                    max_context)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, *, rows_per_forward: int = 64,
                   max_context: int | None = None) -> HFEngine:
        """An engine on a model already in memory (an evaluation's), on the model's device and dtype."""
        engine = cls.__new__(cls)
        param = next(model.parameters())
        engine.device, engine.dtype, engine.policy_dir = param.device, param.dtype, ""
        engine._setup(tokenizer, model.eval(), rows_per_forward, max_context)
        return engine

    def _setup(self, tokenizer: Any, model: Any, rows_per_forward: int, max_context: int | None) -> None:
        self.tokenizer, self.model, self.rows_per_forward = tokenizer, model, rows_per_forward
        self.max_context = max_context or int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.eos = _eos_ids(self.tokenizer, self.model)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos, default=0))
        # transformers 5.x names the KV cache ``cache`` (argument and output); 4.x ``past_key_values``.
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def _load_model(self, hf_dir: str | Path) -> Any:
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=self.dtype)
        return model.to(self.device).eval()

    def load_weights(self, hf_dir: str | Path) -> None:
        """The updated policy's weights from its exported HF folder, loaded into the model in place (strict: the
        same architecture and parameter names)."""
        fresh = self._load_model(hf_dir)
        self.model.load_state_dict(fresh.state_dict(), strict=True)
        self.policy_dir = str(hf_dir)

    def encode(self, prompt: str, max_new_tokens: int) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.max_context, max_new_tokens)

    def generate(self, prompts: Sequence[str], k: int, params: RolloutParams, seeds: Sequence[int], *,
                 logprobs: bool = True) -> list[list[Completion]]:
        """``k`` samples per prompt. ``logprobs=False`` skips the log-prob bookkeeping (the benchmark's bare
        reference); the sampled tokens are the same either way."""
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        return self.generate_ids([self.encode(p, params.max_new_tokens) for p in prompts], k, params, seeds,
                                 logprobs=logprobs)

    def generate_ids(self, contexts: Sequence[Sequence[int]], k: int, params: RolloutParams, seeds: Sequence[int],
                     *, logprobs: bool = True) -> list[list[Completion]]:
        """``k`` samples per context of token ids (token in, token out)."""
        check_contexts(contexts, seeds, self.max_context, params.max_new_tokens)
        rows = [(i, j) for i in range(len(contexts)) for j in range(k)]
        encoded = [list(c) for c in contexts]
        out: list[list[Completion]] = [[] for _ in contexts]
        for start in range(0, len(rows), self.rows_per_forward):
            chunk = rows[start:start + self.rows_per_forward]
            done = self._generate_rows([encoded[i] for i, _ in chunk],
                                       [sample_seed(int(seeds[i]), j) for i, j in chunk], params, logprobs)
            for (i, _), completion in zip(chunk, done, strict=True):
                out[i].append(completion)
        return out

    @torch.no_grad()
    def _generate_rows(self, prompt_ids: list[list[int]], row_seeds: list[int], params: RolloutParams,
                       want_logprobs: bool) -> list[Completion]:
        n, width, steps = len(prompt_ids), max(len(p) for p in prompt_ids), params.max_new_tokens
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for r, p in enumerate(prompt_ids):
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        uniforms = torch.stack([torch.rand(steps, generator=torch.Generator().manual_seed(s)) for s in row_seeds])
        ids, mask, uniforms = ids.to(self.device), mask.to(self.device), uniforms.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        tokens: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        reason: list[str | None] = [None] * n
        texts = [""] * n
        longest_stop = max((len(s) for s in params.stop), default=0)
        cache = preallocated_cache(self.model, width + steps)
        out = self._prefill(ids, mask, positions, cache, prompt_ids)
        next_pos = positions[:, -1:] + 1
        for t in range(steps):
            logp = torch.log_softmax(out.logits[:, -1, :].float() / logprob_temperature(params.temperature), dim=-1)
            chosen = logp.argmax(-1) if params.greedy else sample_from(logp, params.top_p, uniforms[:, t])
            chosen_list = chosen.tolist()
            chosen_lp = logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).tolist() if want_logprobs else None
            for r in range(n):
                if reason[r] is not None:
                    continue
                tok = chosen_list[r]
                tokens[r].append(tok)
                if chosen_lp is not None:
                    lps[r].append(chosen_lp[r])
                if tok in self.eos:
                    reason[r] = "eos"
                elif tok in params.stop_token_ids:
                    reason[r] = "stop"
                elif params.stop:
                    text = str(self.tokenizer.decode(tokens[r], skip_special_tokens=True))
                    tail = text[max(0, len(texts[r]) - longest_stop + 1):]
                    texts[r] = text
                    if any(s in tail for s in params.stop):
                        reason[r] = "stop"
                if reason[r] is None and len(tokens[r]) == steps:
                    reason[r] = "length"
            if all(r is not None for r in reason):
                break
            feed = torch.tensor([tokens[r][-1] if reason[r] is None else self.pad_id for r in range(n)],
                                device=self.device).unsqueeze(-1)
            mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=self.device)], dim=-1)
            out = self.model(input_ids=feed, attention_mask=mask, position_ids=next_pos, use_cache=True,
                             **{self._cache_arg: getattr(out, self._cache_arg)})
            next_pos = next_pos + 1
        result = []
        for r in range(n):
            text, _ = truncate_at_stop(str(self.tokenizer.decode(tokens[r], skip_special_tokens=True)), params.stop)
            result.append(Completion(text, list(prompt_ids[r]), tokens[r], lps[r], str(reason[r])))
        return result

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any | None,
                 prompt_ids: list[list[int]]) -> Any:
        """The prompts' forward pass, each distinct prompt once: the k samples of a prompt share its keys, values
        and first logits (copied into their rows). On CPU that is bit-identical to computing every row (tested:
        a row's arithmetic there does not depend on the batch's other rows); a GPU's kernels may be chosen by
        batch size. Only with the preallocated cache, whose rows can be copied; the model's own cache prefills
        every row."""
        slot: dict[tuple[int, ...], int] = {}
        firsts: list[int] = []  # the first row of each distinct prompt
        source: list[int] = []  # each row's distinct prompt
        for r, p in enumerate(prompt_ids):
            key = tuple(p)
            if key not in slot:
                slot[key] = len(firsts)
                firsts.append(r)
            source.append(slot[key])
        if cache is None or len(firsts) == len(prompt_ids):
            return self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                              logits_to_keep=1, **({self._cache_arg: cache} if cache is not None else {}))
        unique = torch.tensor(firsts, device=ids.device)
        out = self.model(input_ids=ids[unique], attention_mask=mask[unique], position_ids=positions[unique],
                         use_cache=True, logits_to_keep=1, **{self._cache_arg: cache})
        rows = torch.tensor(source, device=ids.device)
        for layer in cache.layers:
            layer.select_rows(rows)
        out.logits = out.logits.index_select(0, rows)
        return out


def _iter_safetensors(hf_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors.torch import safe_open

    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                yield name, fh.get_tensor(name)


class VLLMWorkerExtension:
    """Mixed into every vLLM worker (``LLM(worker_extension_cls=...)``): the weight sync the engine calls through
    ``LLM.collective_rpc``. vLLM 0.32's worker reloads weights in place itself (``reload_weights``: it reads the
    tensors into the model's parameters, then redoes the kernel-format processing a plain
    ``model.load_weights`` leaves stale); this streams the folder's safetensors into it, reprocesses a tied
    output head, and reports how many tensors it read."""

    def codemill_load_weights(self, hf_dir: str) -> int:
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for item in _iter_safetensors(hf_dir):
                count += 1
                yield item

        self.reload_weights(weights_iterator=counted())  # type: ignore[attr-defined]  # the vLLM worker's
        # A tied output head (tie_word_embeddings) shares the embedding's tensor, so reload_weights loads nothing
        # into it and skips its processing: on CPU the head's packed GEMM copy (cpu_linear) kept the old weights
        # and the logits came from them. Redo it (it keeps the weight itself: safe for an untied head too).
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)
        return count


def vllm_available() -> bool:
    """Whether ``vllm`` can be imported here (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


VLLM_MISSING = ("rl.rollout.engine is vllm but vllm is not importable here: build its environment with "
                "scripts/vllm-env DIR (pip install vllm under constraints-vllm.txt) and run codemill from DIR/bin "
                "(docs/rl.md#vllm)")


class VLLMEngine:
    """vLLM behind the same interface (the ``vllm`` extra, in its own environment: ``scripts/vllm-env``).

    Prompts are encoded as ``HFEngine`` encodes them (no special tokens, left-truncated to the context) and given
    to vLLM as token ids, so both engines see the same prompt tokens; the text is decoded from the sampled ids as
    ``HFEngine`` does. One request per sample with ``SamplingParams(n=1, seed=sample_seed(prompt seed, j),
    logprobs=0)``: vLLM seeds each request's generator, so a sample does not depend on the rest of the batch (the
    same idea as ``HFEngine``; the two engines do not draw the same samples); the prefix cache computes each
    prompt once. Greedy (temperature 0) is vLLM's argmax: the same tokens as ``HFEngine``'s on the same weights,
    up to near-ties that kernel rounding can flip.

    Log-probs: ``logprobs_mode="processed_logprobs"`` returns them after temperature **and** after top-k/top-p
    (renormalised over the nucleus), so they equal the contract's value only when top_p is 1, which is what this
    engine uses then (for greedy, vLLM's processed log-probs are at temperature 1, as the contract's). With
    top_p < 1 the engine recomputes them with a teacher-forced pass of an HF copy of the policy
    (``teacher_forced_logprobs``; ``recompute_device``), the same computation the update does. The model runs in
    ``dtype`` (bf16 by default): its log-probs differ from the trainer's fp32 ones by kernel rounding (the
    sampler/trainer mismatch TRL corrects with importance sampling); ``dtype="float32"`` narrows it (measured
    differences: docs/rl.md#vllm). Stops: vLLM's ``stop`` strings end a sample; its ``token_ids`` then include
    the token that completed the stop, as the contract wants (``finish_reason`` "stop" with ``stop_reason`` None
    is EOS).
    """

    def __init__(self, policy_dir: str | Path, *, dtype: str = "bfloat16", gpu_memory_utilization: float = 0.5,
                 max_context: int | None = None, recompute_device: str | None = None, **llm_kwargs: Any) -> None:
        try:
            vllm = importlib.import_module("vllm")
        except ImportError as exc:
            raise RuntimeError(VLLM_MISSING) from exc
        from transformers import AutoTokenizer

        self._vllm = vllm
        self.policy_dir = str(policy_dir)
        self.recompute_device = recompute_device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._hf: HFEngine | None = None
        self.tokenizer = AutoTokenizer.from_pretrained(self.policy_dir)
        if max_context is not None:
            llm_kwargs.setdefault("max_model_len", max_context)
        self.llm = vllm.LLM(model=self.policy_dir, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                            logprobs_mode="processed_logprobs",
                            worker_extension_cls=f"{__name__}.VLLMWorkerExtension", **llm_kwargs)
        self.max_context = int(self.llm.llm_engine.model_config.max_model_len)

    def load_weights(self, hf_dir: str | Path) -> None:
        """The updated policy's weights into the running workers (no restart), then the prefix cache dropped: its
        KV entries were computed with the old weights, and a cached prompt would otherwise keep them."""
        counts = self.llm.collective_rpc("codemill_load_weights", args=(str(hf_dir),))
        if not counts or min(counts) == 0:
            raise RuntimeError(f"{hf_dir}: no weights were loaded into the vLLM workers ({counts})")
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after the weight sync")
        if self._hf is not None:
            self._hf.load_weights(hf_dir)
        self.policy_dir = str(hf_dir)

    def close(self) -> None:
        """Stop vLLM's engine-core process (and its workers) now; idempotent. vLLM stops it when the ``LLM`` is
        garbage-collected, but an engine kept alive until interpreter exit (a module-level cache) must be closed
        before: multiprocessing's exit handler joins the non-daemon EngineCore process, which then waits for a
        shutdown request that never comes, and the process hangs after its work is done."""
        if not getattr(self, "_closed", False):
            self._closed = True
            self.llm.llm_engine.engine_core.shutdown()

    def encode(self, prompt: str, max_new_tokens: int) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.max_context, max_new_tokens)

    def generate(self, prompts: Sequence[str], k: int, params: RolloutParams,
                 seeds: Sequence[int]) -> list[list[Completion]]:
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        return self.generate_ids([self.encode(p, params.max_new_tokens) for p in prompts], k, params, seeds)

    def generate_ids(self, contexts: Sequence[Sequence[int]], k: int, params: RolloutParams,
                     seeds: Sequence[int]) -> list[list[Completion]]:
        """``k`` samples per context of token ids (token in, token out), given to vLLM as token prompts."""
        check_contexts(contexts, seeds, self.max_context, params.max_new_tokens)
        # One request per sample, each with its own seed (as HFEngine's rows); the prefix cache shares the prompt.
        requests = [(i, j) for i in range(len(contexts)) for j in range(k)]
        encoded = [list(c) for c in contexts]
        sp = [self._vllm.SamplingParams(n=1, seed=None if params.greedy else sample_seed(int(seeds[i]), j) % 2**31,
                                        temperature=params.temperature, top_p=1.0 if params.greedy else params.top_p,
                                        max_tokens=params.max_new_tokens, stop=list(params.stop),
                                        stop_token_ids=list(params.stop_token_ids), logprobs=0,
                                        include_stop_str_in_output=False)
              for i, j in requests]
        outputs = self.llm.generate([{"prompt_token_ids": encoded[i]} for i, _ in requests], sampling_params=sp,
                                    use_tqdm=False)
        result: list[list[Completion]] = [[] for _ in contexts]
        for (i, _), req in zip(requests, outputs, strict=True):
            prompt_ids = list(req.prompt_token_ids)
            (c,) = req.outputs
            ids = list(c.token_ids)
            if params.top_p < 1.0 and not params.greedy:
                lps = teacher_forced_logprobs(self._recompute_model(), prompt_ids, ids, params.temperature)
            else:
                lps = [float(step[tok].logprob) for step, tok in zip(c.logprobs, ids, strict=True)]
            reason = "length" if c.finish_reason == "length" else ("stop" if c.stop_reason is not None else "eos")
            text, _ = truncate_at_stop(str(self.tokenizer.decode(ids, skip_special_tokens=True)), params.stop)
            result[i].append(Completion(text, prompt_ids, ids, lps, reason))
        return result

    def _recompute_model(self) -> Any:
        if self._hf is None:
            self._hf = HFEngine(self.policy_dir, device=self.recompute_device)
        return self._hf.model


def build_engine(rollout: RolloutConfig, policy_dir: str | Path, device: str) -> HFEngine | VLLMEngine:
    """The engine ``rollout.engine`` names, on ``policy_dir``, with its context and options: the one place the RL
    flow and the benchmarks make an engine."""
    if rollout.engine == "vllm":
        return vllm_engine(policy_dir, rollout.vllm, rollout.context_len, device)
    return HFEngine(policy_dir, device=device, max_context=rollout.context_len)


def vllm_engine(policy_dir: str | Path, options: Any, max_context: int, device: str) -> VLLMEngine:
    """A vLLM engine with ``options`` (a ``config.VLLMOptions``)."""
    return VLLMEngine(policy_dir, dtype=options.dtype, gpu_memory_utilization=options.gpu_memory_utilization,
                      enforce_eager=options.enforce_eager, max_context=max_context, recompute_device=device)


_LIVE: dict[str, Any] = {}  # the process's vLLM engine: its settings' key and the engine
_LIVE_EXIT: list[bool] = []  # close_live_vllm registered with atexit
_LIVE_LOCK = threading.RLock()  # one user at a time (a rollouts task, an eval suite), nested use in its thread


@contextmanager
def using_live_vllm(policy_dir: str | Path, options: Any, max_context: int, device: str) -> Iterator[VLLMEngine]:
    """The process's vLLM engine (``_live_vllm``) held for one user (a rollouts task, an eval suite) until the
    block ends: another thread of the process (a concurrent Prefect task) waits rather than swap the weights or
    close the engine under it."""
    with _LIVE_LOCK:
        yield _live_vllm(policy_dir, options, max_context, device)


@contextmanager
def rollout_engine(rollout: RolloutConfig, policy_dir: str | Path, device: str
                   ) -> Iterator[tuple[HFEngine | VLLMEngine, float]]:
    """The engine ``rollout.engine`` names on ``policy_dir`` for one rollouts task, and the seconds it took to
    have it on that policy (a fresh HFEngine, or the live vLLM engine's weight load; waiting for another user of
    the live engine is not counted)."""
    if rollout.engine == "vllm":
        with _LIVE_LOCK:
            t0 = time.monotonic()
            engine: HFEngine | VLLMEngine = _live_vllm(policy_dir, rollout.vllm, rollout.context_len, device)
            yield engine, time.monotonic() - t0
        return
    t0 = time.monotonic()
    engine = build_engine(rollout, policy_dir, device)
    yield engine, time.monotonic() - t0


def _live_vllm(policy_dir: str | Path, options: Any, max_context: int, device: str) -> VLLMEngine:
    """The process's vLLM engine, started once and given each later policy's weights (``load_weights``: no
    restart, the prefix cache reset) rather than one engine start per rollouts task or eval suite; other
    ``options`` (a ``config.VLLMOptions``) or another context length start a fresh one."""
    import atexit
    import json

    key = json.dumps([options.model_dump(), max_context, device])
    live = _LIVE.get("vllm")
    if live is not None and live[0] == key:
        engine: VLLMEngine = live[1]
        if engine.policy_dir != str(policy_dir):
            engine.load_weights(policy_dir)
        return engine
    close_live_vllm()  # other settings: a fresh engine
    if not _LIVE_EXIT:  # registered after multiprocessing's exit handler, so it runs first (atexit is LIFO)
        atexit.register(close_live_vllm)
        _LIVE_EXIT.append(True)
    engine = vllm_engine(policy_dir, options, max_context, device)
    _LIVE["vllm"] = (key, engine)
    return engine


def close_live_vllm() -> None:
    """Stop the process's live vLLM engine, if any (``VLLMEngine.close``): at the end of the ``rl`` and
    ``evaluate`` flows and at exit. Kept until exit, its EngineCore process would make the interpreter hang
    there. Waits for the engine's current user."""
    with _LIVE_LOCK:
        live = _LIVE.pop("vllm", None)
        if live is not None:
            live[1].close()


def engine_info(engine: RolloutEngine) -> dict[str, str]:
    """What sampled a rollouts artifact (recorded in its manifest): the engine and its library's version."""
    from importlib.metadata import PackageNotFoundError, version

    if isinstance(engine, VLLMEngine):
        return {"engine": "vllm", "version": str(engine._vllm.__version__)}
    try:
        return {"engine": "hf", "version": version("transformers")}
    except PackageNotFoundError:
        return {"engine": "hf", "version": "unknown"}
