"""VLLMEngine against HFEngine (the reference) on the same tiny policy, prompts, k and new tokens, in one run:
engine start time and sampled completions per second, with the ratios. Run it in the vLLM environment
(scripts/vllm-env DIR):

    DIR/bin/python -m benchmarks.vllm_engine [--prompts 8] [--k 4] [--new-tokens 32] [--dtype float32]

On CPU it sets vLLM's CPU settings when unset (1 GiB KV cache, threads not pinned). Each engine samples one
untimed warm-up call first; the timed call is the same prompts x k for both."""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", help="an HF folder (default: the tiny preset's shape, random weights)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

    import torch
    import transformers
    import vllm

    from codemill.models.engines import HFEngine, RolloutParams, VLLMEngine
    from codemill.problems.synthetic import synthetic_problems

    policy = args.policy
    if policy is None:
        from tests.integration.rl_setup import make_start_policy

        policy = str(make_start_policy(Path(tempfile.mkdtemp()) / "policy"))
    prompts = [p.prompt for p in synthetic_problems(0, args.prompts)]
    seeds = list(range(len(prompts)))
    params = RolloutParams(temperature=1.0, max_new_tokens=args.new_tokens)
    print(f"vllm {vllm.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch threads "
          f"{torch.get_num_threads()}")
    print(f"{len(prompts)} prompts x k={args.k}, {args.new_tokens} new tokens, temperature 1, dtype {args.dtype}")

    rows = {}
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    for name, make in (("HFEngine", lambda: HFEngine(policy, dtype=dtype)),
                       ("VLLMEngine", lambda: VLLMEngine(policy, dtype=args.dtype, enforce_eager=True,
                                                         max_context=512))):
        t0 = time.perf_counter()
        engine = make()
        start_s = time.perf_counter() - t0
        engine.generate(prompts[:1], 1, params, seeds[:1])  # warm-up
        t0 = time.perf_counter()
        out = engine.generate(prompts, args.k, params, seeds)
        gen_s = time.perf_counter() - t0
        tokens = sum(len(c.completion_ids) for g in out for c in g)
        rows[name] = (start_s, len(prompts) * args.k / gen_s, tokens / gen_s)
        del engine
    print(f"{'engine':<12}{'start s':>10}{'samples/s':>12}{'tokens/s':>12}")
    for name, (s, sps, tps) in rows.items():
        print(f"{name:<12}{s:>10.2f}{sps:>12.1f}{tps:>12.0f}")
    (hs, hsps, htps), (vs, vsps, vtps) = rows["HFEngine"], rows["VLLMEngine"]
    print(f"ratio vLLM/HF: start {vs / hs:.1f}x, samples/s {vsps / hsps:.2f}x, tokens/s {vtps / htps:.2f}x")


if __name__ == "__main__":  # vLLM spawns its workers: the engine must start under this guard
    main()
