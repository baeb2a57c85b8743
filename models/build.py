"""Building a Llama-style causal LM from the tiny/small configs."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from codemill.models.config import ModelConfig
from codemill.models.masking import SDPA, attention_implementation


def llama_config(cfg: ModelConfig, vocab_size: int, max_len: int, eos_id: int, pad_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=max_len,
        # transformers 5 reads the legacy keyword into rope_parameters (4.x takes it as is); its hints omit it.
        rope_theta=cfg.rope_theta,  # type: ignore[call-arg]
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id, tie_word_embeddings=True,
        attention_dropout=cfg.attention_dropout,
    )


def build_model(cfg: ModelConfig, vocab_size: int, max_len: int, eos_id: int, pad_id: int,
                seed: int) -> LlamaForCausalLM:
    """Deterministic init: the same seed gives the same weights on every rank and machine."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(cfg, vocab_size, max_len, eos_id, pad_id))
    model.config.use_cache = False
    return model


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def load_pretrained(name_or_path: str, seed: int) -> torch.nn.Module:
    """A pretrained causal LM from a local save_pretrained folder or a hub name (full fp32 weights)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, torch_dtype=torch.float32)
    model.config.use_cache = False
    return model


def build_like(name_or_path: str, seed: int) -> torch.nn.Module:
    """``load_pretrained``'s model without reading its weights (seeded random ones): for a caller that sets
    the weights from memory next."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(name_or_path), dtype=torch.float32)
    model.config.use_cache = False
    return model


def use_attention(model: Any, device: torch.device, document_masking: bool) -> str:
    """Set the attention kernel a training run uses on ``model`` (a transformers model or its peft wrapper) and
    return its name, which the train summary records (FlexAttention and SDPA agree only to float tolerance).
    FlexAttention needs a model class that supports it (``_supports_flex_attn``; a pretrained one may not)."""
    dropout = float(getattr(model.config, "attention_dropout", 0.0) or 0.0)
    impl = attention_implementation(device, document_masking, dropout)
    if not getattr(model, "_supports_flex_attn", False):
        impl = SDPA
    if model.config._attn_implementation != impl:
        model.set_attn_implementation(impl)
    return impl


def scratch_policy(out: Path, texts: Sequence[str], vocab_size: int, model: ModelConfig, max_len: int = 512,
                   seed: int = 0, split_digits: bool = False) -> Path:
    """``out/hf``: a randomly initialised model and a BPE tokenizer trained on ``texts``, in the layout a train
    artifact exports (what the RL flow, the evaluation and the benchmarks load as a policy)."""
    from codemill.data.tokenizer import EOS_TOKEN, PAD_TOKEN, save_tokenizer, train_bpe
    tok = train_bpe(texts, vocab_size, min_frequency=2, split_digits=split_digits)
    save_tokenizer(tok, out / "tok")
    eos, pad = tok.token_to_id(EOS_TOKEN), tok.token_to_id(PAD_TOKEN)
    assert eos is not None and pad is not None  # train_bpe adds both as special tokens
    weights = build_model(model, tok.get_vocab_size(), max_len, eos, pad, seed=seed)
    write_export(weights, out / "tok", out)
    return out / "hf"


def write_export(model: PreTrainedModel, tokenizer_dir: Path, out_dir: Path, name: str = "hf") -> None:
    """``out_dir/name``: the model as ``save_pretrained`` writes it, with the tokenizer's files beside it: the
    folder ``from_pretrained``, the evaluation and the RL engines load."""
    hf_dir = out_dir / name
    model.config.use_cache = True
    model.save_pretrained(str(hf_dir), safe_serialization=True)
    for f in (tokenizer_dir / "hf").iterdir():
        shutil.copy2(f, hf_dir / f.name)
