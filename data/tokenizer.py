"""Training a byte-level BPE tokenizer. Byte-level BPE is lossless, which bits-per-byte relies on."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = [EOS_TOKEN, PAD_TOKEN]


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path) -> None:
    """tokenizer.json plus a transformers-loadable folder (AutoTokenizer.from_pretrained)."""
    from transformers import PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN,
                                   pad_token=PAD_TOKEN, unk_token=None)
    fast.save_pretrained(str(out_dir / "hf"))


def load_tokenizer(tok_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
