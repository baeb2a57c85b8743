"""CPU training throughput: the codemill trainer vs a bare PyTorch loop (same model, batch, sequence).

Both run in this process, one rank, interleaved. The trainer runs with checkpoints effectively off and no
MLflow; it still does its data-order lookups, LR schedule, grad clipping and loss bookkeeping. The bare loop
is model + AdamW + fixed random batches.

    python -m benchmarks.train [--steps 30] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from codemill.config import load_preset
from codemill.data.config import IngestConfig, TokenizeConfig
from codemill.data.ingest import run_ingest
from codemill.data.tokenize import build_tokenizer, run_tokenize
from codemill.models.build import build_model
from codemill.models.trainer import TrainSpec, train


def bare_loop(cfg, vocab: int, seq_len: int, steps: int) -> float:
    model = build_model(cfg.model, vocab, seq_len, 0, 1, cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, vocab, (cfg.micro_batch_size, seq_len), generator=g) for _ in range(8)]
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        x = batches[step % len(batches)]
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * cfg.micro_batch_size * seq_len / (time.perf_counter() - t0)


def codemill_loop(cfg, root: Path, stats: dict, steps: int, masking: bool, run: int) -> float:
    tcfg = cfg.model_copy(update={"max_steps": steps, "checkpoint_every": 10**9, "log_every": 10**9,
                                  "nproc_per_node": 1, "document_masking": masking, "device": "cpu"})
    spec = TrainSpec(train=tcfg, tokens_dir=str(root / "tokens" / "train"), tokenizer_dir=str(root / "tokenizer"),
                     out_dir=str(root / f"out-{run}"), ckpt_dir=str(root / f"ckpt-{run}"),
                     vocab_size=stats["vocab_size"], eos_id=stats["eos_id"], pad_id=stats["pad_id"],
                     seq_len=stats["seq_len"])
    with contextlib.redirect_stdout(io.StringIO()):
        summary = train(spec)
    return summary["tokens_seen"] / summary["wall_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MLFLOW_RUN_ID"):
        os.environ.pop(k, None)
    preset = load_preset("tiny")
    cfg = preset.train
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run_ingest(IngestConfig(val_fraction=0.0), root / "corpus")
        tok_cfg = TokenizeConfig(vocab_size=preset.tokenize.vocab_size, seq_len=preset.tokenize.seq_len)
        build_tokenizer(tok_cfg, root / "corpus", root / "tokenizer")
        stats = run_tokenize(tok_cfg, root / "corpus", root / "tokenizer", root / "tokens")
        bare, ours, ours_masked = [], [], []
        for r in range(args.repeats):
            bare.append(bare_loop(cfg, stats["vocab_size"], stats["seq_len"], args.steps))
            ours.append(codemill_loop(cfg, root, stats, args.steps, masking=False, run=2 * r))
            ours_masked.append(codemill_loop(cfg, root, stats, args.steps, masking=True, run=2 * r + 1))
    b, o, om = statistics.median(bare), statistics.median(ours), statistics.median(ours_masked)
    print(f"tiny preset model, micro batch {cfg.micro_batch_size} x {stats['seq_len']} tokens, {args.steps} steps, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}")
    print(f"{'':<46} {'tokens/s':>10} {'ratio':>6}")
    print(f"{'reference: bare PyTorch loop':<46} {b:>10,.0f} {1.0:>6.2f}")
    print(f"{'codemill trainer (same attention)':<46} {o:>10,.0f} {o / b:>6.2f}")
    print(f"{'codemill trainer + document masking':<46} {om:>10,.0f} {om / b:>6.2f}")
    print(f"trainer / bare: {o / b:.2f}x (target >= 0.9x)")


if __name__ == "__main__":
    main()
