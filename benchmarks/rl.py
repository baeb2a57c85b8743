"""One RL iteration, where its time goes: generation, rewards (the sandbox) and the GRPO update, with and without
overlapping the judge with generation; then the rollout comparisons of ``benchmarks.rl_rollout`` (rollout
throughput against bare batched generation, reward throughput against bare sandbox execution).

The iteration is the rl flow's own pieces outside Prefect: ``collect_rollouts`` (HFEngine or vLLM, JudgePool)
then ``codemill.rl.update`` under torchrun (DDP or FSDP2) on the rollouts it just wrote, then the engine
reloading the updated weights (weight sync). Dynamic sampling is off so the update does its full work even when
an untrained policy fails every problem (a policy that passes some is given with ``--policy``).

    python -m benchmarks.rl [--policy HF_DIR] [--problems 32] [--k 8] [--max-new-tokens 64] [--repeats 2]
                            [--nproc 2] [--parallelism ddp|fsdp] [--engine hf|vllm] [--device cpu|cuda]
                            [--size tiny|125m] [--skip-rollout-comparison]

On a GPU machine: ``benchmarks/rl_gpu.sh`` (vLLM sampling, FSDP2 updates).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import torch

from codemill.cpus import usable_cpus
from codemill.evals.humaneval import STOP_SEQUENCES
from codemill.models.engines import HFEngine, RolloutEngine, RolloutParams, VLLMEngine
from codemill.models.launch import threads_per_rank, torchrun_command
from codemill.problems.synthetic import synthetic_problems
from codemill.rl.algorithms.grpo import GRPOConfig
from codemill.rl.envs import env_for
from codemill.rl.rollout import collect_rollouts
from codemill.rl.trajectory import write_rollouts
from codemill.rl.update import SUMMARY, RLUpdateSpec
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool


def update_once(policy: str, rollouts: Path, work: Path, args: argparse.Namespace) -> tuple[float, dict]:
    """The GRPO update under torchrun, as the rl task launches it: wall seconds (start-up included) and metrics."""
    grpo = GRPOConfig(dynamic_sampling=False, lr=1e-4, micro_batch_size=8, nproc_per_node=args.nproc,
                      parallelism=args.parallelism, device=args.device)
    spec = RLUpdateSpec(grpo=grpo, policy_dir=policy, rollouts_path=str(rollouts), out_dir=str(work / "out"),
                        ckpt_dir=str(work / "ckpt"), max_new_tokens=args.max_new_tokens)
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.json").write_text(spec.model_dump_json())
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_rank(args.nproc)), "TQDM_DISABLE": "1"}
    t0 = time.perf_counter()
    r = subprocess.run(torchrun_command(str(work / "spec.json"), args.nproc, module="codemill.rl.update"),
                       env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"the update failed:\n{(r.stdout + r.stderr)[-3000:]}")
    return wall, json.loads((work / "out" / SUMMARY).read_text())["metrics"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", type=Path, default=None, help="an HF folder (default: a fresh tiny model)")
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-problems", type=int, default=8)
    ap.add_argument("--workers", type=int, default=usable_cpus(), help="judge pool slots")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2, help="update ranks (torchrun)")
    ap.add_argument("--parallelism", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=usable_cpus(),
                    help="batches generated at once, one torch thread each (rl.rollout.threads; the flow's "
                    "default: one per usable core)")
    ap.add_argument("--size", choices=("tiny", "125m"), default="tiny",
                    help="the fresh policy's shape when --policy is not given (125m: benchmarks.gpu_train's)")
    ap.add_argument("--skip-rollout-comparison", action="store_true")
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory()
    root = Path(tmp.name)
    if args.policy is None:
        from benchmarks.rl_rollout import tiny_policy

        if args.size == "tiny":
            args.policy = tiny_policy(root / "policy")
        else:
            from benchmarks.gpu_train import SIZES
            from codemill.models.build import scratch_policy

            texts = [p.prompt + (p.reference_solution or "") for p in synthetic_problems(0, 200)]
            args.policy = scratch_policy(root / "policy", texts, 1000, SIZES[args.size], max_len=1024)
    policy = str(args.policy)
    engine: RolloutEngine = (HFEngine(policy, device=args.device, rows_per_forward=args.batch_problems * args.k)
                             if args.engine == "hf" else VLLMEngine(policy))
    problems = synthetic_problems(3, args.problems)
    params = RolloutParams(temperature=1.0, max_new_tokens=args.max_new_tokens, stop=STOP_SEQUENCES)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    torch.set_num_threads(1)  # one per generating batch, as the rl task runs it
    with JudgePool(Limits(wall_s=3.0, cpu_s=3), workers=args.workers) as pool:
        env = env_for(None, engine, pool, params.max_new_tokens)
        collect_rollouts(engine, env, problems[:4], args.k, params, 999, batch_problems=4)  # warm-up
        for rep in range(args.repeats):
            for overlap in (False, True):
                env = env_for(None, engine, pool, params.max_new_tokens)
                rows, t = collect_rollouts(engine, env, problems, args.k, params, 100 + rep,
                                           batch_problems=args.batch_problems, overlap=overlap,
                                           generators=args.threads if args.engine == "hf" else 1)
                path = write_rollouts(rows, root / f"rollouts-{rep}-{overlap}.parquet")
                update_s, metrics = update_once(policy, path, root / f"update-{rep}-{overlap}", args)
                t0 = time.perf_counter()
                engine.load_weights(root / f"update-{rep}-{overlap}" / "out")
                sync_s = time.perf_counter() - t0
                engine.load_weights(policy)  # every repeat samples from the same policy
                runs[overlap].append({"generation_s": t.generation_s, "reward_s": t.reward_s,
                                      "reward_wait_s": t.reward_wait_s, "rollout_wall_s": t.wall_s,
                                      "update_s": update_s, "weight_sync_s": sync_s,
                                      "iteration_s": t.wall_s + update_s + sync_s, "samples": t.samples,
                                      "tokens": t.tokens, "pass_rate": sum(r["reward"] for r in rows) / len(rows),
                                      "update_tokens": metrics.get("tokens", 0)})
    med = {o: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for o, rs in runs.items()}
    print(f"RL iteration: {args.problems} synthetic problems x k={args.k} = {args.problems * args.k} samples, "
          f"max_new_tokens={args.max_new_tokens}, {args.workers} judge slots, update: {args.parallelism} x "
          f"{args.nproc} on {args.device}, median of {args.repeats}")
    print(f"python {platform.python_version()}, torch {torch.__version__}, transformers {version('transformers')}, "
          f"engine {args.engine}, {args.threads} generation threads with overlap (one torch thread each); pass rate "
          f"{med[True]['pass_rate']:.2f}")
    print(f"{'':<22}{'overlap off':>14}{'overlap on':>14}   share of the iteration (on)")
    on = med[True]
    for key in ("generation_s", "reward_s", "reward_wait_s", "rollout_wall_s", "update_s", "weight_sync_s",
                "iteration_s"):
        share = f"{on[key] / on['iteration_s']:>8.0%}" if key not in ("reward_wait_s", "iteration_s",
                                                                      "rollout_wall_s") else ""
        print(f"{key:<22}{med[False][key]:>14.2f}{on[key]:>14.2f}   {share}")
    print(f"rollout: {on['samples'] / on['rollout_wall_s']:.1f} samples/s, {on['tokens'] / on['rollout_wall_s']:.1f}"
          f" tokens/s; update: {on['update_tokens'] / on['update_s']:.1f} tokens/s (torchrun start-up included)")
    print(f"iteration wall, overlap on / off: {med[False]['iteration_s'] / on['iteration_s']:.2f}x speed-up; "
          f"rollout wall {med[False]['rollout_wall_s'] / on['rollout_wall_s']:.2f}x")
    tmp.cleanup()
    if not args.skip_rollout_comparison:
        print()
        from benchmarks import rl_rollout

        sys.argv = [sys.argv[0], "--problems", "16", "--k", "4", "--device", args.device, "--engine", args.engine]
        rl_rollout.main()


if __name__ == "__main__":
    main()
