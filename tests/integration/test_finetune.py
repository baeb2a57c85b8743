"""Fine-tuning a pretrained model (a local stand-in for a hub model), fully and with LoRA."""

from __future__ import annotations

import json

import pytest
import torch

from codemill.models.config import LoraConfig, ModelConfig
from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]


@pytest.fixture(scope="module")
def base_model(small_corpus, tmp_path_factory):
    """A small pretrained-style folder: Llama weights + a tokenizer WITHOUT FIM or pad tokens."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from codemill.data.tokenizer import train_bpe
    from codemill.models.build import build_model

    root = tmp_path_factory.mktemp("base") / "tiny-base"
    texts = [p.read_text() for p in sorted(small_corpus.rglob("*.py"))[:200]]
    bpe: Tokenizer = train_bpe(texts, vocab_size=700, min_frequency=2, special_tokens=["<|endoftext|>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.save_pretrained(str(root))
    model = build_model(ModelConfig(hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2),
                        vocab_size=len(fast), max_len=128, eos_id=fast.eos_token_id, pad_id=fast.eos_token_id, seed=7)
    model.save_pretrained(str(root))
    return root


@pytest.mark.parametrize("lora", [False, True])
def test_finetune_from_a_local_pretrained_folder(small_corpus, tmp_path, base_model, lora):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from codemill.flows.pipeline import pipeline

    cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=12)
    cfg.train.init_from = str(base_model)
    cfg.train.lr = 1e-2 if lora else 1e-3  # adapters start at zero and need the usual higher LoRA rate
    cfg.train.lora = LoraConfig(r=4, alpha=8) if lora else None
    cfg.evaluate.suites = ["bpb"]
    cfg.gate.enabled = False
    out = pipeline(config=cfg)
    store = ArtifactStore(cfg.store_root)
    tok_manifest = store.read_manifest(ArtifactRef.model_validate(out["stages"]["tokenizer"]["ref"]))
    assert tok_manifest.stats["source"] == str(base_model)
    base_vocab = len(AutoTokenizer.from_pretrained(str(base_model)))
    assert tok_manifest.stats["vocab_size"] == base_vocab + 4  # 3 FIM sentinels and a pad token were added

    train_dir = store.local_path(ArtifactRef.model_validate(out["stages"]["train"]["ref"]))
    summary = json.loads((train_dir / "train_summary.json").read_text())
    losses = summary["losses"]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses  # means: single-batch losses are noisy
    tuned = AutoModelForCausalLM.from_pretrained(str(train_dir / "hf"))
    base = AutoModelForCausalLM.from_pretrained(str(base_model))
    assert tuned.get_input_embeddings().num_embeddings == base_vocab + 4
    assert not any(k.startswith("base_model") or "lora_" in k for k in tuned.state_dict())  # merged, plain model
    changed = [k for k, v in base.state_dict().items()
               if "embed" not in k and "lm_head" not in k and not torch.equal(v, tuned.state_dict()[k])]
    if lora:  # adapters merged into the targeted projections only; norms untouched
        assert changed and all("proj" in k for k in changed)
    else:
        assert any("norm" in k for k in changed)
