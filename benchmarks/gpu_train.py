"""GPU throughput and MFU of the codemill trainer: bf16 + torch.compile + FSDP2, synthetic packed tokens.

    python -m benchmarks.gpu_train --size 125m [--steps 60] [--gpus N] [--no-masking]

Tokens are random (throughput does not depend on content), written as ordinary token shards so the real
data path, trainer and launcher are what is measured. Documents are packed as the tokenize stage packs them
(positions restart at each document, lengths exponential with mean ``--doc-len``), and document masking is on
unless ``--no-masking``: the trainer then runs FlexAttention with a per-batch block mask (the run prints which
attention implementation ran). Prints the steady-state tokens/s and MFU reported by the trainer (its peak
table: H100/H200 989 TFLOP/s dense bf16; MFU counts full causal attention FLOPs either way).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from codemill.data.pack import positions_from_starts
from codemill.models.config import ModelConfig, TrainConfig
from codemill.models.launch import torchrun_command
from codemill.models.trainer import TrainSpec

SIZES = {  # Llama-style; parameter counts include the 32k embedding (tied)
    "125m": ModelConfig(hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12, num_kv_heads=12),
    "350m": ModelConfig(hidden_size=1024, intermediate_size=2816, num_layers=24, num_heads=16, num_kv_heads=16),
}
VOCAB, SEQ = 32768, 2048


def write_tokens(out: Path, rows: int, doc_len: int) -> None:
    """Random tokens, and the positions of documents packed back to back (each starts with probability
    1/doc_len at every token, so lengths are exponential with that mean)."""
    out.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.save(out / "tokens-00000.npy", rng.integers(2, VOCAB, size=(rows, SEQ), dtype=np.uint16))
    starts = rng.random((rows, SEQ)) < 1 / doc_len
    np.save(out / "positions-00000.npy", positions_from_starts(starts).astype(np.uint16))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", choices=sorted(SIZES), default="125m")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-masking", action="store_true", help="plain causal attention over whole rows")
    ap.add_argument("--doc-len", type=int, default=512, help="mean packed document length in tokens")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_tokens(root / "tokens", rows=args.micro_batch * args.gpus * (args.steps + 1), doc_len=args.doc_len)
        (root / "tokenizer" / "hf").mkdir(parents=True)
        cfg = TrainConfig(model=SIZES[args.size], parallelism="fsdp", nproc_per_node=args.gpus, device="cuda",
                          dtype="bfloat16", compile=not args.no_compile, max_steps=args.steps,
                          micro_batch_size=args.micro_batch, lr=3e-4, warmup_steps=10, checkpoint_every=10**9,
                          log_every=5, document_masking=not args.no_masking)
        spec = TrainSpec(train=cfg, tokens_dir=str(root / "tokens"), tokenizer_dir=str(root / "tokenizer"),
                         out_dir=str(root / "out"), ckpt_dir=str(root / "ckpt"), vocab_size=VOCAB, eos_id=0, pad_id=1,
                         seq_len=SEQ)
        (root / "spec.json").write_text(spec.model_dump_json())
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        proc = subprocess.run(torchrun_command(str(root / "spec.json"), args.gpus), env=env, capture_output=True,
                              text=True)
        events = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0:
            raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
    start = next(e for e in events if e["event"] == "start")
    steps = [e for e in events if e["event"] == "step"][2:]  # skip warm-up / compilation windows
    tps = statistics.median(e["tokens_per_s"] for e in steps)
    mfu = statistics.median(e["mfu"] for e in steps) if all("mfu" in e for e in steps) else float("nan")
    masking = "off" if args.no_masking else f"on (documents of mean {args.doc_len} tokens)"
    print(f"{args.size}: {start['params'] / 1e6:.0f}M params, {args.gpus} GPU(s), seq {SEQ}, micro batch "
          f"{args.micro_batch}, bf16 + {'eager' if args.no_compile else 'compile'} + FSDP2, document masking "
          f"{masking}, attention {start.get('attention')}")
    print(f"  tokens/s: {tps:,.0f}   MFU: {mfu:.1%}   (target MFU >= 40% on H100/H200)")


if __name__ == "__main__":
    main()
