"""RL rollout throughput: ``collect_rollouts`` against bare generation and bare sandbox execution, with and without
overlapping the judge with generation.

All in one run, interleaved per repeat (machine-load drift hits every variant alike), median of ``--repeats``:

* generation: the same prompts x k, the same batch of rows, the same sampling settings and stops, timed as
  - ``hf generate``: transformers' own ``model.generate`` (a KV cache, left padding, no log-probs),
  - ``engine bare``: ``HFEngine.generate(logprobs=False)`` (the rollout engine's loop, no log-prob bookkeeping),
  - ``engine``: ``HFEngine.generate`` (log-probs kept), and ``collect_rollouts``' own generation time;
* rewards: ``JudgePool.judge_all`` on the very completions the rollouts made, in one call (bare sandbox
  execution), against ``collect_rollouts``' judge time (per-batch ``rewards.score`` calls, retries, rows);
* wall time of ``collect_rollouts`` with ``overlap=True`` vs ``overlap=False``.

A warm-up collection runs first (the judge pool starts its second slot's servers on first use).

The policy is a fresh untrained model of the tiny preset's shape unless ``--policy HF_DIR`` names one. On a GPU
machine with vLLM: ``--engine vllm --device cuda`` (the engine-bare rows stay transformers' own loop).

    python -m benchmarks.rl_rollout [--problems 16] [--k 4] [--max-new-tokens 64] [--batch-problems 4]
                                    [--workers N] [--repeats 3] [--policy HF_DIR] [--threads 1]
                                    [--engine hf|vllm] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import torch

from codemill.cpus import usable_cpus
from codemill.evals.humaneval import STOP_SEQUENCES
from codemill.models.engines import (
    HFEngine,
    RolloutEngine,
    RolloutParams,
    VLLMEngine,
    derive_seed,
    encode_prompt,
    teacher_forced_logprobs,
    truncate_at_stop,
)
from codemill.problems.synthetic import synthetic_problems
from codemill.rl.envs import env_for
from codemill.rl.rollout import collect_rollouts, prompt_seed
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool


def tiny_policy(root: Path) -> Path:
    """An untrained model with the tiny preset's shape and a tokenizer trained on the synthetic problems."""
    from codemill.config import load_preset
    from codemill.models.build import scratch_policy

    texts = [p.prompt + (p.reference_solution or "") for p in synthetic_problems(0, 200)]
    return scratch_policy(root, texts, 1000, load_preset("tiny").train.model, max_len=1024)


def bwrap_version() -> str:
    """The bwrap the judge pool runs (the system's or the bundled one: ``CODEMILL_BWRAP``) and its version."""
    from codemill.sandbox.binary import resolve

    found = resolve()
    return f"{found.version} ({found.origin})"


def hf_generate(hf: HFEngine, prompts: list[str], max_new_tokens: int, temperature: float, seed: int) -> list[str]:
    """One batch through transformers' ``model.generate`` (its fast path: one call, a KV cache, sampling), the
    prompts encoded and left-truncated as the engine encodes them, the texts cut at the stop sequences after."""
    tok = hf.tokenizer
    enc = [encode_prompt(tok, p, hf.max_context, max_new_tokens) for p in prompts]
    width = max(len(e) for e in enc)
    ids = torch.full((len(enc), width), hf.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, e in enumerate(enc):
        ids[row, width - len(e):] = torch.tensor(e)
        mask[row, width - len(e):] = 1
    torch.manual_seed(seed)
    out = hf.model.generate(input_ids=ids.to(hf.device), attention_mask=mask.to(hf.device),
                            max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_p=None,
                            top_k=None, use_cache=True, pad_token_id=hf.pad_id, eos_token_id=tok.eos_token_id)
    return [truncate_at_stop(t, STOP_SEQUENCES)[0]
            for t in tok.batch_decode(out[:, width:], skip_special_tokens=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-problems", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=usable_cpus(), help="judge pool slots")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policy", type=Path, default=None, help="an HF folder (default: a fresh tiny model)")
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                    help="vllm: the rollouts on VLLMEngine (a GPU machine with vLLM installed); the references stay on "
                    "transformers on the same device, and the log-prob gap to the fp32 recompute is printed")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default); on a shared "
                    "machine one thread avoids OpenMP spinning against other processes")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    tmp = tempfile.TemporaryDirectory()
    policy = args.policy or tiny_policy(Path(tmp.name))
    hf = HFEngine(policy, rows_per_forward=args.batch_problems * args.k, device=args.device)
    engine: RolloutEngine = hf if args.engine == "hf" else VLLMEngine(policy, dtype="float32")
    problems = synthetic_problems(1, args.problems)
    params = RolloutParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, stop=STOP_SEQUENCES)
    limits = Limits(wall_s=3.0, cpu_s=3)
    n = args.problems * args.k
    bp = args.batch_problems
    batches = [problems[i:i + bp] for i in range(0, len(problems), bp)]
    times: dict[str, list[float]] = {}
    tokens: dict[str, int] = {}

    def record(name: str, seconds: float, toks: int) -> None:
        times.setdefault(name, []).append(seconds)
        tokens[name] = toks

    with JudgePool(limits, workers=args.workers) as pool:
        # Warm-up (not recorded): every judge slot's servers started, the model's first forward passes done.
        env = env_for(None, engine, pool, params.max_new_tokens)
        collect_rollouts(engine, env, problems, args.k, params, 999, batch_problems=bp)
        for rep in range(args.repeats):
            seed = 1000 + rep
            t0 = time.perf_counter()
            texts: list[str] = []
            for b, batch in enumerate(batches):
                prompts = [p.prompt for p in batch for _ in range(args.k)]
                texts += hf_generate(hf, prompts, args.max_new_tokens, args.temperature, derive_seed(seed, b))
            record("hf generate (no log-probs)", time.perf_counter() - t0,
                   sum(len(hf.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts))

            for name, logprobs in (("engine bare (no log-probs)", False), ("engine (log-probs)", True)):
                t0 = time.perf_counter()
                toks = 0
                for batch in batches:
                    groups = [problems.index(p) for p in batch]
                    out = hf.generate([p.prompt for p in batch], args.k, params,
                                      [prompt_seed(seed, g) for g in groups], logprobs=logprobs)
                    toks += sum(len(c.completion_ids) for cs in out for c in cs)
                record(name, time.perf_counter() - t0, toks)

            runs = {}
            for overlap in (False, True):
                env = env_for(None, engine, pool, params.max_new_tokens)
                rows, timing = collect_rollouts(engine, env, problems, args.k, params, seed, batch_problems=bp,
                                                overlap=overlap)
                runs[overlap] = timing
                record(f"collect_rollouts wall, overlap={overlap}", timing.wall_s, timing.tokens)
            record("collect_rollouts generation", runs[False].generation_s, runs[False].tokens)
            record("collect_rollouts judge (overlap=False)", runs[False].reward_s, runs[False].tokens)
            for overlap in (False, True):
                record(f"  waiting on the judge, overlap={overlap}", runs[overlap].reward_wait_s, 0)

            by_id = {p.problem_id: p for p in problems}
            t0 = time.perf_counter()
            pool.judge_all([by_id[r["problem_id"]].request(r["completion"]) for r in rows])
            record("bare JudgePool.judge_all", time.perf_counter() - t0, 0)
    gap = max(abs(a - b) for r in rows for a, b in zip(
        teacher_forced_logprobs(hf.model, r["prompt_ids"], r["completion_ids"], args.temperature), r["logprobs"],
        strict=True))
    tmp.cleanup()

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"RL rollouts: {args.problems} synthetic problems x k={args.k} = {n} samples, batches of {bp} problems "
          f"({bp * args.k} rows), max_new_tokens={args.max_new_tokens}, T={args.temperature}, "
          f"{args.workers} judge slots, median of {args.repeats}")
    print(f"python {platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"transformers {version('transformers')}, {bwrap_version()}")
    print(f"rollout engine: {args.engine} on {args.device}; max |log-prob - fp32 teacher-forced recompute| = {gap:.2e}")
    print(f"{'variant':<42} {'s':>8} {'samples/s':>10} {'tokens/s':>10}")
    for name, s in med.items():
        tok = f"{tokens[name] / s:>10.1f}" if tokens[name] else f"{'':>10}"
        print(f"{name:<42} {s:>8.2f} {n / s:>10.1f} {tok}")

    def tps(name: str) -> float:
        return tokens[name] / med[name]

    def sps(name: str) -> float:
        return n / med[name]

    gen = "collect_rollouts generation"
    print("generation ratios (>1 = faster than the reference); samples/s: the same samples and settings, but "
          "hf generate\n  runs every row on until all rows of a batch hold a stop (checked every 8 tokens), and its "
          "tokens are\n  counted on the kept text; tokens/s: the engine variants generate the same tokens:")
    print(f"  collect_rollouts generation / hf generate:  {sps(gen) / sps('hf generate (no log-probs)'):.2f}x "
          "samples/s")
    print(f"  collect_rollouts generation / engine bare:  {tps(gen) / tps('engine bare (no log-probs)'):.2f}x "
          "tokens/s")
    print(f"  engine (log-probs) / engine bare:           "
          f"{tps('engine (log-probs)') / tps('engine bare (no log-probs)'):.2f}x tokens/s")
    print("reward and wall ratios (>1 = faster):")
    print(f"  collect_rollouts judge / bare judge_all:    "
          f"{med['bare JudgePool.judge_all'] / med['collect_rollouts judge (overlap=False)']:.2f}x samples/s")
    wall_on, wall_off = med["collect_rollouts wall, overlap=True"], med["collect_rollouts wall, overlap=False"]
    print(f"  wall, overlap on / off:                     {wall_off / wall_on:.2f}x speed-up "
          f"({wall_on:.2f} s vs {wall_off:.2f} s)")


if __name__ == "__main__":
    main()
