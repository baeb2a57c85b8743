"""Prefect tasks of RL for code: rollouts (sampled and judged in the sandbox) and policy updates (GRPO under
torchrun, or a fine-tune with the pipeline's trainer for rejection sampling and the warm start).

Every step is planned before it runs (``plan_rollouts``, ``plan_update``, ``plan_warm_start``): a rollouts
artifact hashes the sampling policy, the problem set, the iteration and the rollout settings; a policy artifact
hashes the policy it started from, its training data (the rollouts, or the problems for the warm start) and the
update settings. The chain of digests is known up front, so a flow killed between iterations resumes at the
first artifact missing from the store, with the same problems and seeds it would have used.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger

from codemill import metrics, progress
from codemill.lineage import Lineage
from codemill.lineage import tags as T
from codemill.models.config import TrainConfig
from codemill.plan import StagePlan
from codemill.rl.config import RLConfig
from codemill.store import ArtifactRef, ArtifactStore, ArtifactWriter, Manifest
from codemill.tasks.common import RunContext, StageResult, run_stage, stage_task
from codemill.tasks.train import on_cuda, run_torchrun, torchrun_env, trainer_line_handler

ROLLOUTS = "rollouts"
POLICY = "policy"
ROLLOUTS_CODE_VERSION = "rollouts-v4"
POLICY_CODE_VERSION = "policy-v4"
ROLLOUTS_FILE = "rollouts.parquet"
HELDOUT = "val"


def rollout_seed(cfg: RLConfig, split: str, iteration: int | None) -> int:
    """Iteration i samples with its own seed; both held-out rollouts (before/after) share one, so the two
    policies draw with common random numbers and their paired difference has less noise."""
    from codemill.models.engines import derive_seed

    return derive_seed("rl", cfg.seed, split, iteration if split != HELDOUT else "heldout")


def plan_rollouts(cfg: RLConfig, policy: ArtifactRef, problems: ArtifactRef, iteration: int | None,
                  split: str = "train") -> StagePlan:
    """k samples per problem of ``policy``: the train problems of ``iteration``, or every held-out problem."""
    config: dict[str, Any] = {"split": split, "seed": cfg.seed, "env": cfg.env.digest_config(),
                              "rollout": cfg.rollout.digest_config()}
    if split == HELDOUT:
        config["samples_per_problem"] = cfg.heldout_samples
        name = "heldout"
    else:
        config["iteration"] = iteration
        name = f"it{iteration:03d}"
    return StagePlan(stage=ROLLOUTS, name=name, code_version=ROLLOUTS_CODE_VERSION, config=config,
                     inputs={"policy": policy, "problems": problems})


def _update_config(cfg: RLConfig, train: TrainConfig, iteration: int) -> dict[str, Any]:
    from codemill.models.engines import derive_seed
    from codemill.rl.algorithms import algorithm

    seed = derive_seed("rl-update", cfg.seed, iteration) % 2**31
    return algorithm(cfg.algorithm.name).update_config(cfg, train, iteration, seed)


def plan_update(cfg: RLConfig, train: TrainConfig, policy: ArtifactRef, rollouts: ArtifactRef,
                iteration: int) -> StagePlan:
    """The policy after iteration ``iteration``: ``policy`` updated on ``rollouts`` (GRPO or rejection sampling)."""
    return StagePlan(stage=POLICY, name=f"{cfg.algorithm.name}-it{iteration:03d}", code_version=POLICY_CODE_VERSION,
                     config=_update_config(cfg, train, iteration), inputs={"policy": policy, "rollouts": rollouts})


def plan_warm_start(cfg: RLConfig, train: TrainConfig, policy: ArtifactRef, problems: ArtifactRef) -> StagePlan:
    """``policy`` fine-tuned on the train problems' reference solutions (before iteration 0)."""
    from codemill.rl.algorithms.rft import finetune_train_config

    ft = finetune_train_config(train, cfg.warm_start, cfg.seed)
    return StagePlan(stage=POLICY, name="warm-start", code_version=POLICY_CODE_VERSION,
                     config={"algorithm": "sft", "train": ft.digest_config(), "seq_len": cfg.warm_start.seq_len,
                             "share": cfg.warm_start_share},
                     inputs={"policy": policy, "problems": problems})


def policy_dir(store: ArtifactStore, ref: ArtifactRef) -> str:
    """The HF folder of a policy (or train) artifact."""
    return str(store.local_path(ref) / "hf")


def _problems(store: ArtifactStore, ref: ArtifactRef, split: str, cfg: RLConfig) -> list[Any]:
    """The ``split`` tasks of ``ref``: problems, or the artifact of the stage ``cfg.env``'s tasks come from."""
    from codemill.rl.envs import read_tasks

    return read_tasks(cfg.env, store.local_path(ref), split)


def _device(cfg: RLConfig) -> str:
    """Where the rollouts' engine runs: the update's device (a GRPO update's own, else auto)."""
    return "cuda" if on_cuda(getattr(cfg.algorithm, "device", "auto")) else "cpu"


@stage_task("rollouts")
def rollouts_task(plan: StagePlan, ctx: RunContext, cfg: RLConfig, policy_hf: str,
                  ray_address: str | None = None) -> StageResult:
    from codemill.rl.collect import collect_iteration
    from codemill.rl.data import iteration_problems
    from codemill.rl.metrics import rollout_metrics
    from codemill.rl.trajectory import write_rollouts

    logger = get_run_logger()
    store = ctx.store()
    problems_ref = plan.input("problems")
    split = plan.config["split"]

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        pool = _problems(store, problems_ref, "train" if split != HELDOUT else HELDOUT, cfg)
        if not pool:
            raise ValueError(f"{problems_ref.uri}: the problem set has no {split} problems")
        if split == HELDOUT:
            chosen, k = sorted(pool, key=lambda p: p.problem_id), cfg.heldout_samples
        else:
            by_id = {p.problem_id: p for p in pool}
            ids = iteration_problems(list(by_id), cfg.rollout.problems_per_iteration, cfg.seed,
                                     plan.config["iteration"])
            chosen, k = [by_id[i] for i in ids], cfg.rollout.samples_per_problem
        seed = rollout_seed(cfg, split, plan.config.get("iteration"))
        rows, timings = collect_iteration(cfg, chosen, policy_hf, seed, k, device=_device(cfg), ray_address=ray_address,
                                          say=lambda msg: progress.sink().stage(ROLLOUTS, f"{plan.name}: {msg}"))
        write_rollouts(rows, w.path(ROLLOUTS_FILE))
        stats = {**rollout_metrics(rows, k), "timings": timings, "samples_per_problem": k, "seed": seed,
                 "problem_ids": [p.problem_id for p in chosen]}
        report_iteration(split, plan.config.get("iteration"), stats)
        logger.info("%s: %d samples, reward %.3f, pass rate %.3f, zero-variance groups %.2f, %.1f samples/s",
                    plan.name, stats["samples"], stats["reward_mean"], stats["pass_rate"],
                    stats["zero_variance_groups"], timings["samples_per_s"])
        return w.finish(stats)

    return run_stage(ctx, plan, produce, _record_rollouts(plan), _rollouts_summary)


def report_iteration(split: str, iteration: int | None, stats: dict[str, Any]) -> None:
    """The rollouts' reward, pass rate and zero-variance groups as gauges (the RL dashboard's per-iteration view)."""
    m = metrics.get()
    if iteration is not None:
        m.rl_iteration.set(iteration)
    m.rl_reward_mean.labels(split).set(stats["reward_mean"])
    m.rl_pass_rate.labels(split).set(stats["pass_rate"])
    m.rl_zero_variance_groups.labels(split).set(stats["zero_variance_groups"])


def _rollouts_summary(m: Manifest) -> dict[str, Any]:
    from codemill.rl.metrics import COUNTED, SUMMARY_KEYS

    return {k: m.stats[k] for k in (*SUMMARY_KEYS, *COUNTED) if k in m.stats} | {"timings": m.stats["timings"]}


def _record_rollouts(plan: StagePlan):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        from codemill.rl.metrics import scalar_metrics

        lineage.log_dataset_input(run_id, plan.input("problems"), "input", name="problems")
        lineage.log_dataset_input(run_id, ArtifactRef(stage=m.stage, name=m.name, digest=m.digest, uri=m.uri),
                                  "output", name="rollouts")
        lineage.log_metrics(run_id, scalar_metrics(m.stats))
        return {}
    return record


@stage_task("policy")
def update_task(plan: StagePlan, ctx: RunContext, cfg: RLConfig, train: TrainConfig, policy_hf: str,
                reference_hf: str | None = None) -> StageResult:
    """One policy update: the job ``rl.algorithm``'s rule builds (``codemill.rl.algorithms``), or the warm start
    (the trainer on the reference solutions), launched under torchrun."""
    from codemill.rl.algorithms import algorithm

    store = ctx.store()
    rule = algorithm(cfg.algorithm.name)
    launch = rule.launch_config(cfg, train) if plan.config["algorithm"] != "sft" else train

    def produce(w: ArtifactWriter, run_id: str) -> Manifest:
        scratch = Path(ctx.work_dir).absolute() / "rl" / f"{plan.name}-{plan.digest[:12]}"
        t0 = time.monotonic()
        job = _warm_start_job(plan, ctx, cfg, train, policy_hf, w, scratch) if plan.config["algorithm"] == "sft" \
            else rule.job(_update_inputs(plan, ctx, cfg, train, policy_hf, reference_hf, w, scratch))
        if isinstance(job, dict):  # nothing to train: the policy goes on unchanged, and the manifest says so
            stats = {**job, "update_s": 0.0}
        else:
            if job.served:
                _serve_update(job, plan, ctx)
            else:
                run_torchrun(job.spec, w.dir, job.launch, ctx, run_id, POLICY, module=job.module)
            stats = {**job.result(), "update_s": time.monotonic() - t0}
        manifest = w.finish(stats)
        shutil.rmtree(scratch, ignore_errors=True)  # resume scratch; the committed export supersedes it
        return manifest

    return run_stage(ctx, plan, produce, _record_policy(store, plan), _policy_summary,
                     gpus=launch.nproc_per_node if on_cuda(launch.device) else 0, system_metrics=True)


def _serve_update(job: Any, plan: StagePlan, ctx: RunContext) -> None:
    """The update on the run's long-lived workers (started with the first update, kept for the next)."""
    import uuid

    from codemill.rl.update_workers import UpdateWorkers, live_workers

    launch = job.launch
    key = f"{launch.nproc_per_node}:{launch.device}:{Path(ctx.work_dir).absolute()}"
    control = Path(ctx.work_dir).absolute() / "rl" / f"workers-{uuid.uuid4().hex[:12]}"
    progress.sink().stage(POLICY, f"update workers x{launch.nproc_per_node}")
    workers = live_workers(key, lambda: UpdateWorkers(launch.nproc_per_node, control,
                                                      torchrun_env(launch, ctx, None)))
    workers.run(job.spec, plan.input("policy").digest, plan.digest, launch.timeout_s, trainer_line_handler(POLICY))


def _update_inputs(plan: StagePlan, ctx: RunContext, cfg: RLConfig, train: TrainConfig, policy_hf: str,
                   reference_hf: str | None, w: ArtifactWriter, scratch: Path) -> Any:
    from codemill.rl.algorithms import UpdateInputs

    store = ctx.store()
    rollouts, start = plan.input("rollouts"), plan.input("policy")
    return UpdateInputs(cfg, train, plan.config, policy_hf, store.local_path(rollouts) / ROLLOUTS_FILE,
                        rollouts.stage, rollouts.digest,
                        store.local_path(start) if start.stage == POLICY else None, reference_hf, w.dir, scratch)


def _warm_start_job(plan: StagePlan, ctx: RunContext, cfg: RLConfig, train: TrainConfig, policy_hf: str,
                    w: ArtifactWriter, scratch: Path) -> Any:
    from transformers import AutoTokenizer

    from codemill.rl.algorithms.rft import finetune_job
    from codemill.rl.data import seeded_share, solution_documents

    data = plan.input("problems")
    solved = [p for p in _problems(ctx.store(), data, "train", cfg) if getattr(p, "reference_solution", None)]
    if not solved:
        raise ValueError(f"{data.uri}: no train task has a reference solution to warm-start on")
    shown = set(seeded_share([p.problem_id for p in solved], plan.config["share"], cfg.seed))
    docs = solution_documents([(p.prompt, p.reference_solution or "") for p in solved if p.problem_id in shown],
                              AutoTokenizer.from_pretrained(policy_hf))
    return finetune_job("sft", docs, cfg.warm_start, train, plan.config, policy_hf, (data.stage, data.digest), w.dir,
                        scratch)


def _policy_summary(m: Manifest) -> dict[str, Any]:
    return {k: m.stats[k] for k in ("algorithm", "update", "documents", "steps", "final_loss", "unchanged",
                                    "update_s") if k in m.stats}


def _record_policy(store: ArtifactStore, plan: StagePlan):
    def record(lineage: Lineage, run_id: str, m: Manifest) -> dict[str, Any]:
        from codemill.rl.metrics import update_metrics

        data_name = "rollouts" if "rollouts" in plan.inputs else "problems"
        data = plan.input(data_name)
        lineage.log_dataset_input(run_id, data, "training", name=data_name)
        ref = store.ref(m.stage, m.name, m.digest)
        model_id = lineage.find_model(m.digest)
        if model_id is None:
            model_id = lineage.log_checkpoint(run_id, ref, store.local_path(ref) / "hf", data,
                                              step=int(plan.config.get("iteration", -1)) + 1,
                                              params={"rl": plan.config})
        metrics = update_metrics(m.stats)
        if metrics:
            lineage.log_metrics(run_id, metrics)
        sampling = lineage.find_model(plan.input("policy").digest)
        lineage.tag(run_id, {T.MODEL_ID: model_id, **({T.SAMPLING_MODEL_ID: sampling} if sampling else {})})
        return {"model_id": model_id}
    return record
