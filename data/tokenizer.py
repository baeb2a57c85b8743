"""Training a byte-level BPE tokenizer. Byte-level BPE is lossless, which bits-per-byte relies on."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX = "<fim_prefix>", "<fim_middle>", "<fim_suffix>"
FIM_TOKENS = [FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX]
SPECIAL_TOKENS = [EOS_TOKEN, PAD_TOKEN, *FIM_TOKENS]


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int,
              special_tokens: list[str] | None = None, split_digits: bool = False) -> Tokenizer:
    """``split_digits``: every digit its own token (as StarCoder's and Llama's tokenizers do), so a number reads
    the same wherever it stands ("_55" and " 55" share the tokens of "55") and copying it is copying tokens."""
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS if special_tokens is None else special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path) -> dict:
    """tokenizer.json plus a transformers-loadable folder (AutoTokenizer.from_pretrained)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN,
                                   pad_token=PAD_TOKEN, unk_token=None,
                                   additional_special_tokens=FIM_TOKENS)
    return save_fast_tokenizer(fast, out_dir, source="trained")


def prepare_base_tokenizer(name_or_path: str, out_dir: Path) -> dict:
    """A base model's tokenizer (local folder or hub name), with pad and FIM sentinels added if missing."""
    from transformers import AutoTokenizer

    fast = AutoTokenizer.from_pretrained(name_or_path, use_fast=True)
    if fast.eos_token is None:
        raise ValueError(f"{name_or_path}: the tokenizer has no EOS token to separate documents")
    missing = [t for t in FIM_TOKENS if t not in fast.get_vocab()]
    if missing:
        fast.add_tokens(missing, special_tokens=True)
    if fast.pad_token is None:
        fast.add_special_tokens({"pad_token": PAD_TOKEN})
    return save_fast_tokenizer(fast, out_dir, source=name_or_path)


def save_fast_tokenizer(fast, out_dir: Path, source: str) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir / "hf"))
    fast.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    vocab = fast.get_vocab()
    info = {"source": source, "vocab_size": len(fast), "eos_id": fast.eos_token_id, "pad_id": fast.pad_token_id,
            "bos_id": fast.bos_token_id, "fim_ids": [vocab[t] for t in FIM_TOKENS]}
    (out_dir / "tokenizer_info.json").write_text(json.dumps(info, indent=2))
    return info


def load_tokenizer(tok_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tok_dir / "tokenizer.json"))


def load_tokenizer_info(tok_dir: Path) -> dict:
    """The ids the stages need (vocab size, eos/pad/bos, FIM sentinels), as ``save_*`` wrote them."""
    return json.loads((tok_dir / "tokenizer_info.json").read_text())
