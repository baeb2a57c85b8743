"""Exact resume: a torchrun job SIGKILLed mid-run and restarted ends with the same losses and weights (trained
with dropout, so the data position, optimizer, scheduler and RNG states must all be restored)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from codemill.data.config import IngestConfig, TokenizeConfig
from codemill.data.ingest import run_ingest
from codemill.data.sources import FolderSource
from codemill.data.tokenize import build_tokenizer, run_tokenize
from codemill.models.build import build_model
from codemill.models.checkpoint import committed_steps
from codemill.models.config import ModelConfig, TrainConfig
from codemill.models.launch import torchrun_command
from codemill.models.trainer import TrainSpec

pytestmark = pytest.mark.integration
STEPS, EVERY, KILL_AT = 16, 5, 12
DROPOUT = 0.1  # the resume test trains with dropout, so the restored RNG states decide the losses after the resume


@pytest.fixture(scope="module")
def tokens(small_corpus, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume-data")
    run_ingest(IngestConfig(sources=[FolderSource(path=str(small_corpus))], val_fraction=0.2), root / "corpus")
    cfg = TokenizeConfig(vocab_size=512, seq_len=64, sequences_per_shard=300)
    build_tokenizer(cfg, root / "corpus", root / "tokenizer")
    stats = run_tokenize(cfg, root / "corpus", root / "tokenizer", root / "tokens")
    (root / "tokens" / "stats.json").write_text(json.dumps(stats))
    return root / "tokens"


def _model(dropout: float = 0.0) -> ModelConfig:
    return ModelConfig(hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
                       attention_dropout=dropout)


def _spec(tokens: Path, work: Path, parallelism: str, dropout: float = 0.0) -> Path:
    stats = json.loads((tokens / "stats.json").read_text())
    cfg = TrainConfig(model=_model(dropout),
                      parallelism=parallelism, nproc_per_node=2, device="cpu", max_steps=STEPS, micro_batch_size=4,
                      grad_accum_steps=2, lr=3e-3, warmup_steps=3, schedule="wsd", checkpoint_every=EVERY,
                      keep_checkpoints=2, log_every=1)
    spec = TrainSpec(train=cfg, tokens_dir=str(tokens / "train"), tokenizer_dir=str(tokens.parent / "tokenizer"),
                     out_dir=str(work / "out"), ckpt_dir=str(work / "ckpt"), vocab_size=stats["vocab_size"],
                     eos_id=stats["eos_id"], pad_id=stats["pad_id"], seq_len=stats["seq_len"])
    work.mkdir(parents=True, exist_ok=True)
    path = work / "spec.json"
    path.write_text(spec.model_dump_json())
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return {**env, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}


def _run(spec: Path, kill_at: int | None = None) -> list[dict]:
    """Run torchrun to the end, or SIGKILL its whole process group once step ``kill_at`` is reported."""
    proc = subprocess.Popen(torchrun_command(str(spec), 2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=_env(), start_new_session=True)
    events, tail = [], []
    for line in proc.stdout:
        tail.append(line)
        if line.startswith("{"):
            events.append(json.loads(line))
            if kill_at is not None and events[-1].get("event") == "step" and events[-1]["step"] >= kill_at:
                os.killpg(proc.pid, signal.SIGKILL)
                break
    proc.wait(timeout=120)
    if kill_at is None:
        assert proc.returncode == 0, "".join(tail[-40:])
    return events


def _weights(work: Path) -> dict:
    return load_file(str(work / "out" / "hf" / "model.safetensors"))


def test_dropout_consumes_the_rng():
    """The resume test below relies on this: with attention dropout the training loss depends on the torch RNG,
    so a resume that did not restore each rank's RNG state would diverge from the straight run."""
    model = build_model(_model(DROPOUT), 512, 64, 0, 1, seed=0)
    assert model.config.attention_dropout == DROPOUT
    x = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    model.train()
    torch.manual_seed(1)
    first, second = model(input_ids=x, labels=x).loss, model(input_ids=x, labels=x).loss
    torch.manual_seed(1)
    assert first != second and model(input_ids=x, labels=x).loss == first  # random masks, fixed by the RNG state
    model.eval()
    assert model(input_ids=x, labels=x).loss == model(input_ids=x, labels=x).loss  # no dropout at eval


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_sigkill_and_resume_is_exact(tokens, tmp_path, parallelism):
    straight = tmp_path / "straight"
    _run(_spec(tokens, straight, parallelism, DROPOUT))
    reference = json.loads((straight / "out" / "train_summary.json").read_text())

    resumed = tmp_path / "resumed"
    spec = _spec(tokens, resumed, parallelism, DROPOUT)
    _run(spec, kill_at=KILL_AT)
    assert not (resumed / "out" / "train_summary.json").exists()
    last = committed_steps(resumed / "ckpt")
    assert last and last[-1] == (KILL_AT // EVERY) * EVERY, last
    assert len(last) <= 2  # keep-last-k pruning
    events = _run(spec)
    assert {"event": "resumed", "step": last[-1]} in events
    summary = json.loads((resumed / "out" / "train_summary.json").read_text())

    assert summary["resumed_from"] == last[-1]
    assert summary["losses"] == reference["losses"]  # bit-identical, before and after the resume point
    assert summary["val_losses"] == reference["val_losses"] and summary["best_step"] == reference["best_step"]
    a, b = _weights(straight), _weights(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name] == b[name]).all(), name
    assert reference["losses"][-1] < reference["losses"][0]


def test_best_checkpoint_is_kept_and_exported(tokens, tmp_path):
    """With a learning rate that diverges late, an earlier checkpoint is the best; it survives pruning."""
    work = tmp_path / "best"
    spec_path = _spec(tokens, work, "ddp")
    spec = TrainSpec.model_validate_json(spec_path.read_text())
    spec.train.lr, spec.train.schedule, spec.train.warmup_steps = 2.0, "cosine", STEPS  # lr ramps up until it diverges
    spec.train.keep_checkpoints = 1
    spec_path.write_text(spec.model_dump_json())
    _run(spec_path)
    summary = json.loads((work / "out" / "train_summary.json").read_text())
    val = {int(k): v for k, v in summary["val_losses"].items()}
    print("val losses by step:", val)
    assert summary["best_step"] == min(val, key=val.get) < STEPS, val
    assert (work / "out" / "best" / "model.safetensors").exists()
    assert summary["best_step"] in committed_steps(work / "ckpt")  # protected from keep-last-1


def test_checkpoint_dirs_are_complete_or_absent(tokens, tmp_path):
    work = tmp_path / "w"
    spec = _spec(tokens, work, "ddp")
    _run(spec, kill_at=EVERY + 1)
    for step_dir in (work / "ckpt").glob("step-*"):
        assert (step_dir / "trainer.pt").exists() and (step_dir / "dcp" / ".metadata").exists()
        assert {p.name for p in step_dir.glob("rank-*.pt")} == {"rank-0.pt", "rank-1.pt"}


def test_launcher_command_for_multinode():
    cmd = torchrun_command("spec.json", 8, nnodes="2", max_restarts=3, rdzv_endpoint="head:29400", rdzv_id="job7")
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert {"--rdzv-backend=c10d", "--rdzv-endpoint=head:29400", "--rdzv-id=job7", "--nnodes=2",
            "--nproc-per-node=8", "--max-restarts=3"} <= set(cmd)
    assert "--standalone" in torchrun_command("spec.json", 2)
