"""What the RL tests share: a starting policy built from scratch (no download) and a config on the synthetic
problems, split by problem instance so the held-out problems are new constants and inputs of trained kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codemill.config import ModelConfig, PipelineConfig
from tests.tiny_policy import make_policy


def make_start_policy(out: Path, seed: int = 0) -> Path:
    """A randomly initialised ~0.9M-parameter Llama of the tiny preset's shape and a BPE tokenizer trained on the
    synthetic family's text, saved as one HF folder (what a train artifact's ``hf/`` holds)."""
    return make_policy(out, seed=seed, vocab_size=512, model_config=ModelConfig())


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
