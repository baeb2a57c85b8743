"""What the RL tests share: a starting policy built from scratch (no download) and a config on the synthetic
problems, split by problem instance so the held-out problems are new constants and inputs of trained kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codemill.config import ModelConfig, PipelineConfig
from codemill.evals.synthetic import synthetic_problems


def make_start_policy(out: Path, seed: int = 0) -> Path:
    """A randomly initialised ~0.9M-parameter Llama and a BPE tokenizer trained on the synthetic family's text,
    saved as one HF folder (what a train artifact's ``hf/`` holds)."""
    from codemill.data.tokenizer import EOS_TOKEN, PAD_TOKEN, save_tokenizer, train_bpe
    from codemill.models.build import build_model

    texts = [p.prompt + (p.reference_solution or "") for p in synthetic_problems(1000 + seed, 200)]
    tok = train_bpe(texts, vocab_size=512, min_frequency=2)
    save_tokenizer(tok, out / "tokenizer")
    model = build_model(ModelConfig(), vocab_size=tok.get_vocab_size(), max_len=512,
                        eos_id=tok.token_to_id(EOS_TOKEN), pad_id=tok.token_to_id(PAD_TOKEN), seed=seed)
    hf = out / "policy"
    model.config.use_cache = True
    model.save_pretrained(str(hf))
    for f in (out / "tokenizer" / "hf").iterdir():
        (hf / f.name).write_bytes(f.read_bytes())
    return hf


def rl_config(root: Path, **rl: Any) -> PipelineConfig:
    """Synthetic problems (split by instance), the RL settings given, no evaluation suites unless asked."""
    data: dict[str, Any] = {
        "name": "rl-test", "store_root": str(root / "store"), "work_dir": str(root / "work"),
        "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
        "problems": {"sources": [{"kind": "synthetic", "seed": 0, "count": 300, "split_by": "problem"}],
                     "val_fraction": 0.2, "decontamination": {"enabled": False}, "workers": 2},
        "train": {"nproc_per_node": 2, "device": "cpu", "log_every": 10},
        "evaluate": {"suites": []},
        "gate": {"enabled": False},
        "rl": rl,
    }
    return PipelineConfig.model_validate(data)
