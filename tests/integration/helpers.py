"""Small configs for integration tests: the tiny preset, shrunk to a small corpus and a few steps."""

from __future__ import annotations

from pathlib import Path

from codemill.config import PipelineConfig, load_preset
from codemill.data.sources import FolderSource
from codemill.problems.config import AugmentConfig


def small_pipeline_config(corpus: Path, tmp: Path, *, max_steps: int = 40, all_suites: bool = False
                          ) -> PipelineConfig:
    """``all_suites``: the preset's suites and HumanEval's augmented tests; else bpb, completion and humaneval
    without them (the suites' own tests and the pipeline test cover the others: every pipeline test that built
    them again would only add time)."""
    cfg = load_preset("tiny")
    cfg.name = f"test-{tmp.name}"
    cfg.store_root = str(tmp / "store")
    cfg.work_dir = str(tmp / "work")
    cfg.mlflow_tracking_uri = f"sqlite:///{tmp / 'mlflow.db'}"
    cfg.ingest.sources = [FolderSource(path=str(corpus))]
    cfg.ingest.val_fraction = 0.3
    cfg.ingest.shard_max_rows = 40
    cfg.tokenize.vocab_size = 1024
    cfg.tokenize.seq_len = 128
    cfg.tokenize.sequences_per_shard = 500
    cfg.train.max_steps = max_steps
    cfg.train.warmup_steps = 5
    cfg.train.checkpoint_every = 20
    cfg.train.log_every = 5
    cfg.train.timeout_s = 300
    cfg.evaluate.bpb.max_files = 40
    cfg.evaluate.bpb.context_len = 128
    cfg.evaluate.completion.max_files = 30
    cfg.evaluate.completion.context_len = 128
    cfg.evaluate.completion.max_new_tokens = 16
    cfg.evaluate.humaneval.max_problems = 20
    cfg.evaluate.humaneval.max_new_tokens = 24
    cfg.evaluate.humaneval.context_len = 128
    cfg.evaluate.humaneval_infilling.max_tasks_per_type = 4
    cfg.evaluate.humaneval_infilling.max_new_tokens = 8
    cfg.evaluate.humaneval_infilling.context_len = 128
    cfg.augment = AugmentConfig(max_inputs=16, rounds=1, max_mutants=6)  # humaneval.plus's tests, built small
    cfg.evaluate.bootstrap_samples = 300
    if not all_suites:
        cfg.evaluate.suites = ["bpb", "completion", "humaneval"]
        cfg.evaluate.humaneval.plus = False
    return cfg


def quick_pipeline_config(corpus: Path, tmp: Path, *, max_steps: int = 3) -> PipelineConfig:
    """``small_pipeline_config`` cut further, for tests of how runs behave rather than of what they score: a few
    training steps, and bpb and completion on a few files."""
    cfg = small_pipeline_config(corpus, tmp, max_steps=max_steps)
    cfg.evaluate.suites = ["bpb", "completion"]
    cfg.evaluate.bpb.max_files = 12
    cfg.evaluate.completion.max_files = 8
    cfg.evaluate.completion.max_new_tokens = 8
    cfg.evaluate.bootstrap_samples = 100
    return cfg


def chain_config(corpus: Path, tmp: Path) -> PipelineConfig:
    """The least run of every stage, for tests of the chain of runs, artifacts and records rather than of the data
    or the model: 3 steps on one rank, bpb on 10 files, no near-dedup or decontamination."""
    cfg = small_pipeline_config(corpus, tmp, max_steps=3)
    cfg.evaluate.suites = ["bpb"]
    cfg.train.nproc_per_node = 1
    cfg.evaluate.bpb.max_files = 10
    cfg.ingest.near_dedup.enabled = False
    cfg.ingest.decontamination.enabled = False
    return cfg
