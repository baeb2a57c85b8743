"""One GRPO iteration, codemill against TRL's ``GRPOTrainer``, at equal work, in one process, rounds interleaved.

Work per iteration, the same on both sides: the same tiny policy (``benchmarks.rl_rollout.tiny_policy``: the
tiny preset's shape, untrained), the same ``--problems`` synthetic problems x ``--k`` samples at temperature 1,
``--max-new-tokens`` new tokens with no stop strings (TRL's transformers path cannot stop on strings, so neither
side does; the untrained policy rarely ends a sample early, so both generate nearly every token), one sandboxed
binary reward per sample from codemill's own ``problems.rewards.score`` (each completion cut at HumanEval's stop
sequences first), and an update over every sample (no dynamic sampling, no overlong masking) in steps of 16
samples with the same clipped loss (token mean, clip 0.2 / 0.28, no KL), AdamW at a constant ``--lr`` kept
across iterations.

codemill runs as the ``rl`` flow does: ``rl.collect.collect_iteration`` (an HFEngine built on the iteration's
policy, batches generated on one thread per core, judged by the judge pool while other batches generate) then the
update on the run's long-lived workers (``rl.update_workers``: 2 gloo ranks, started once; their start-up is
printed apart). TRL runs its fast path on this hardware: one process on every core, ``model.generate`` over
the whole generation batch, ``steps_per_generation`` so that one generation serves the iteration's 16 steps.

Its split: generation (``_generate``), reward (``_calculate_rewards``), update (the rest: the old log-probs'
forward and the 16 steps). codemill's, in wall time: generation (while any batch was generating), reward (the
time rollouts waited for the judges with nothing generating), update (the workers' wall time), sync (building
the iteration's engine on the new policy) and other (starting the judge pool, writing the rollouts table).

    python -m benchmarks.rl_trl [--problems 32] [--k 8] [--max-new-tokens 64] [--rounds 3] [--lr 1e-4]
                                [--generation-threads N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from codemill.cpus import usable_cpus
from codemill.evals.humaneval import STOP_SEQUENCES
from codemill.models.engines import truncate_at_stop
from codemill.models.launch import threads_per_rank
from codemill.problems.rewards import score
from codemill.problems.synthetic import synthetic_problems
from codemill.rl.algorithms.grpo import GRPOConfig
from codemill.rl.collect import collect_iteration
from codemill.rl.config import RLConfig, RolloutConfig
from codemill.rl.trajectory import write_rollouts
from codemill.rl.update import RLUpdateSpec
from codemill.rl.update_workers import UpdateWorkers
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool

STEP_SAMPLES = 16  # samples per optimizer step, both sides


class CodemillRun:
    """The rl flow's iteration outside Prefect: rollouts, then the update on long-lived workers."""

    def __init__(self, policy: Path, problems: list, root: Path, args: argparse.Namespace) -> None:
        self.problems, self.root, self.args = problems, root, args
        ranks = 2
        self.rl = RLConfig(
            rollout=RolloutConfig(max_new_tokens=args.max_new_tokens, stop=[], samples_per_problem=args.k,
                                  problems_per_iteration=len(problems), threads=args.generation_threads),
            algorithm=GRPOConfig(lr=args.lr, micro_batch_size=STEP_SAMPLES // ranks, nproc_per_node=ranks,
                                 device="cpu", dynamic_sampling=False, overlong_mask=False, checkpoint_every=1000))
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
               "OMP_NUM_THREADS": str(threads_per_rank(ranks)), "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
        self.workers = UpdateWorkers(ranks, root / "control", env)
        self.policy, self.optimizer, self.key, self.i = policy, None, "base", 0

    def iteration(self) -> dict[str, float]:
        a, i = self.args, self.i
        t0 = time.perf_counter()
        rows, t = collect_iteration(self.rl, self.problems, str(self.policy), seed=100 + i, k=a.k)
        path = write_rollouts(rows, self.root / f"rollouts-{i}.parquet")
        out = self.root / f"policy-{i}"
        spec = RLUpdateSpec(grpo=self.rl.algorithm, policy_dir=str(self.policy), rollouts_path=str(path),
                            out_dir=str(out / "hf"), ckpt_dir=str(out / "ckpt"), max_new_tokens=a.max_new_tokens,
                            optimizer_in=self.optimizer, optimizer_out=str(out / "optimizer"))
        t1 = time.perf_counter()
        self.workers.run(spec, self.key, f"policy-{i}", timeout_s=1800, on_line=lambda line: None)
        t2 = time.perf_counter()
        self.policy, self.optimizer, self.key, self.i = out / "hf", str(out / "optimizer"), f"policy-{i}", i + 1
        generation = t["wall_s"] - t["reward_wait_s"]  # wall time, whatever the generation threads summed to
        return {"generation_s": generation, "reward_s": t["reward_wait_s"], "update_s": t2 - t1,
                "sync_s": t["weight_sync_s"], "other_s": (t1 - t0) - t["wall_s"] - t["weight_sync_s"],
                "iteration_s": t2 - t0, "samples": len(rows), "tokens": sum(len(r["completion_ids"]) for r in rows)}


def trl_trainer(policy: Path, problems: list, pool: JudgePool, args: argparse.Namespace, out: Path,
                on_iteration: Any) -> Any:
    """TRL's GRPOTrainer on the same prompts, with codemill's sandboxed reward; ``on_iteration`` runs after every
    iteration's last step (TRL's clock paused)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    by_id = {p.problem_id: p for p in problems}

    def sandboxed_reward(prompts: list[str], completions: list[str], problem_id: list[str], **_: Any) -> list[float]:
        samples = [(pid, truncate_at_stop(c, STOP_SEQUENCES)[0]) for pid, c in zip(problem_id, completions,
                                                                                    strict=True)]
        return [1.0 if r.passed else 0.0 for r in score(by_id, samples, pool).rewards]

    per_iteration = len(problems) * args.k // STEP_SAMPLES
    config = TRLConfig(
        output_dir=str(out), per_device_train_batch_size=STEP_SAMPLES, gradient_accumulation_steps=1,
        steps_per_generation=per_iteration, num_generations=args.k, max_completion_length=args.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
        scale_rewards="group", mask_truncated_completions=False, num_iterations=1, learning_rate=args.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, use_cpu=True,
        bf16=False, max_steps=per_iteration * (args.rounds + 1), logging_steps=per_iteration, save_strategy="no",
        report_to=[], seed=0, shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True)
    tokenizer = AutoTokenizer.from_pretrained(str(policy))
    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32)
    data = Dataset.from_list([{"prompt": p.prompt, "problem_id": p.problem_id} for p in problems])

    class Interleave(TrainerCallback):
        def on_step_end(self, args_: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step % per_iteration == 0:
                on_iteration(state.global_step // per_iteration)

    trainer = GRPOTrainer(model=model, reward_funcs=[sandboxed_reward], args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[Interleave()])
    return trainer


class Timed:
    """Seconds spent in a bound method, summed since the last ``take``."""

    def __init__(self, obj: Any, name: str) -> None:
        self.total, fn = 0.0, getattr(obj, name)

        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.total += time.perf_counter() - t

        setattr(obj, name, timed)

    def take(self) -> float:
        out, self.total = self.total, 0.0
        return out


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="measured iterations per side (after one warm-up)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--generation-threads", type=int, default=None,
                    help="codemill's rl.rollout.threads (default: the flow's, one batch per usable core)")
    args = ap.parse_args()
    if args.problems * args.k % STEP_SAMPLES:
        ap.error(f"problems x k must be a multiple of {STEP_SAMPLES} (samples per optimizer step)")

    from benchmarks.rl_rollout import tiny_policy

    tmp = tempfile.TemporaryDirectory()
    root = Path(tmp.name)
    policy = tiny_policy(root / "policy")
    problems = synthetic_problems(3, args.problems)
    cores = usable_cpus()
    codemill = CodemillRun(policy, problems, root / "codemill", args)
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    marks = {"trl_start": 0.0}
    limits = Limits.of(codemill.rl.rollout)

    with JudgePool(limits, workers=codemill.rl.rollout.workers) as pool:
        trainer = trl_trainer(policy, problems, pool, args, root / "trl",
                              on_iteration=lambda n: after_trl_iteration(n))
        gen, rew = Timed(trainer, "_generate"), Timed(trainer, "_calculate_rewards")

        def after_trl_iteration(n: int) -> None:
            wall = time.perf_counter() - marks["trl_start"]
            g, r = gen.take(), rew.take()
            theirs.append({"generation_s": g, "reward_s": r, "update_s": wall - g - r, "sync_s": 0.0,
                           "other_s": 0.0, "iteration_s": wall, "samples": args.problems * args.k})
            ours.append(codemill.iteration())
            torch.set_num_threads(cores)
            marks["trl_start"] = time.perf_counter()

        torch.set_num_threads(cores)
        marks["trl_start"] = time.perf_counter()
        trainer.train()
        codemill.workers.close()
    trl_tokens = [h.get("completions/mean_length") for h in trainer.state.log_history
                  if "completions/mean_length" in h]

    warm_ours, warm_theirs = ours[0], theirs[0]
    ours, theirs = ours[1:], theirs[1:]
    parts = ("generation_s", "reward_s", "update_s", "sync_s", "other_s", "iteration_s")
    med = {side: {k: statistics.median(r[k] for r in rows) for k in parts}
           for side, rows in (("codemill", ours), ("trl", theirs))}
    samples = args.problems * args.k
    print(f"GRPO iteration, codemill vs TRL GRPOTrainer: {args.problems} synthetic problems x k={args.k} = "
          f"{samples} samples, {args.max_new_tokens} new tokens (no stop strings), every sample trained in "
          f"{samples // STEP_SAMPLES} steps of {STEP_SAMPLES}; median of {len(ours)} interleaved rounds after one "
          f"warm-up each")
    print(f"codemill generation threads: {args.generation_threads or 'the flow default'}")
    print(f"{time.strftime('%Y-%m-%d')}, {platform.machine()} {cores} cores, commit {git_commit()}; python "
          f"{platform.python_version()}, torch {torch.__version__}, transformers {version('transformers')}, trl "
          f"{version('trl')}")
    print(f"generated tokens per sample: codemill {statistics.mean(r['tokens'] for r in ours) / samples:.1f}, "
          f"TRL {statistics.mean(x for x in trl_tokens[1:] if x is not None) if len(trl_tokens) > 1 else 'n/a'}")
    print(f"{'':<16}{'codemill':>10}{'TRL':>10}")
    for key in parts:
        print(f"{key:<16}{med['codemill'][key]:>10.2f}{med['trl'][key]:>10.2f}")
    ours_rate, their_rate = samples / med["codemill"]["iteration_s"], samples / med["trl"]["iteration_s"]
    print(f"{'samples/s':<16}{ours_rate:>10.1f}{their_rate:>10.1f}")
    print(f"codemill / TRL samples/s per full iteration: {ours_rate / their_rate:.2f}x")
    print(f"warm-up iteration (codemill includes starting the update workers): codemill "
          f"{warm_ours['iteration_s']:.2f} s (update {warm_ours['update_s']:.2f} s), TRL "
          f"{warm_theirs['iteration_s']:.2f} s")
    tmp.cleanup()


if __name__ == "__main__":
    main()
