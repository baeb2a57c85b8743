"""What the RL tests share: a base policy that learned from scraped code (no download) and a config on the
synthetic problems, split by problem instance so the held-out problems are new constants and inputs of trained
kinds."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from codemill.config import PipelineConfig
from codemill.models.config import ModelConfig
from codemill.problems.problem import ExecProblem
from tests.tiny_policy import make_policy, pretrain_policy

# What scraped code holds besides real implementations: functions left as stubs.
STUBS = ("    pass\n", "    raise NotImplementedError\n")


def make_start_policy(out: Path, seed: int = 0) -> Path:
    """A randomly initialised ~0.9M-parameter Llama of the tiny preset's shape and a BPE tokenizer trained on the
    synthetic family's text (digits split, as code tokenizers do), saved as one HF folder (a train artifact's
    ``hf/``)."""
    return make_policy(out, seed=seed, vocab_size=512, model_config=ModelConfig(), split_digits=True)


def scraped_code(train: list[ExecProblem], stub_share: float, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, body) documents as a code corpus has them: every train problem's reference solution, and for a
    seeded ``stub_share`` of the problems also a stub (``pass`` / ``raise NotImplementedError``). A model trained
    on it writes a stub for any prompt now and then, a habit no single problem's solution fixes but a reward
    from running the tests does. The held-out problems appear in neither half."""
    rng = random.Random(seed)
    pairs = [(p.prompt, p.reference_solution or "") for p in train]
    return pairs + [(p.prompt, STUBS[i % len(STUBS)]) for i, p in enumerate(train) if rng.random() < stub_share]


def make_base_policy(out: Path, train: list[ExecProblem], seed: int = 0, steps: int = 300) -> Path:
    """``out/hf``: the start policy pretrained on ``scraped_code(train, 0.5)``."""
    start = make_start_policy(out / "init", seed)
    return pretrain_policy(start, out / "hf", scraped_code(train, 0.5, seed), steps=steps, seed=seed)


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
