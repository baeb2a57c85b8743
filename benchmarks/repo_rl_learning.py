"""Does GRPO teach a tiny policy anything on repository tasks? The learning check of the ``repo`` environment.

A ~1M-parameter model cannot fix code it has not seen, so the policy starts from noisy oracle trajectories:
for each train task, the gold fix as the smallest unique ``edit`` (the changed lines, with context only where
they are not unique), its real tool response, then ``submit``; a share of the trajectories is noise (an edit
that leaves the bug in, or a submit with no edit) so the policy's samples differ and GRPO has a signal. The
model and its BPE tokenizer are trained here from scratch on those documents (a plain loop: it stands for the
pretraining a base model had). Then the ``rl`` flow runs GRPO on the train tasks and measures the held-out
resolved rate (other repositories) before and after, paired per task.

    python -m benchmarks.repo_rl_learning --config tasks.yaml --out DIR [--iterations 4] [--k 4]
                                          [--pretrain-steps 300] [--noise 0.3] [--lr 3e-4]

``--config`` is a pipeline config whose ``repo_tasks`` section names the repositories (the flow builds the task
set, or finds it in the store). Prints the iteration table and the held-out comparison as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from codemill.config import PipelineConfig
from codemill.repos.agents import hunks
from codemill.repos.episode import RepoEpisode
from codemill.repos.pytest_run import repo_sandbox
from codemill.repos.toolcall import render_call
from codemill.rl.envs.repo import END_OF_TURN, RepoProblem, messages, observation_text, render_chatml


def smallest_edit(source: str, old: str, new: str) -> tuple[str, str]:
    """``(old, new)`` cut to the lines that differ, widened by one line at a time until ``old`` is unique in
    ``source``."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    lo, hi = head, tail
    while True:
        cut_old, cut_new = "".join(a[lo:len(a) - hi]), "".join(b[lo:len(b) - hi])
        if cut_old and source.count(cut_old) == 1:
            return cut_old, cut_new
        if lo == 0 and hi == 0:
            return old, new
        lo, hi = max(0, lo - 1), max(0, hi - 1)


def trajectory(problem: RepoProblem, snapshot: Path, env: Path, kind: str) -> str:
    """One training document: the prompt, the agent's turns and the real tool responses (``kind``: ``fix``, the
    gold edit; ``wrong``, an edit that keeps the bug; ``idle``, a submit with no edit)."""
    episode = RepoEpisode(problem.task, snapshot, env, repo_sandbox(60))
    try:
        text = render_chatml(messages(problem, "brief"))
        if kind != "idle":
            calls = ""
            for path, old, new in hunks(problem.task.patch):
                source = episode.ws.read_bytes(path).decode()
                old, new = smallest_edit(source, old, new)
                calls += render_call("edit", path=path, old=old, new=new if kind == "fix" else old)
            turn = calls + END_OF_TURN
            text += turn + observation_text(turn, episode.act(calls))
        return text + render_call("submit") + END_OF_TURN
    finally:
        episode.close()


def pretrain(policy: Path, out: Path, docs: list[str], steps: int, seed: int = 0) -> Path:
    """``policy`` fit on the documents, each encoded whole and ended by EOS."""
    from transformers import AutoTokenizer

    from codemill.models.fit import fit_documents

    tok = AutoTokenizer.from_pretrained(str(policy))
    encoded = [tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for d in docs]

    def say(step: int, loss: float) -> None:
        if step % 50 == 0 or step == steps - 1:
            print(json.dumps({"pretrain_step": step, "loss": round(loss, 4)}), flush=True)

    return fit_documents(policy, out, encoded, steps, batch=8, seed=seed, on_step=say)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--lr", type=float, default=3e-4, help="GRPO's learning rate")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from codemill.flows.repo_tasks import repo_tasks
    from codemill.flows.rl import rl
    from codemill.models.build import scratch_policy
    from codemill.models.config import ModelConfig
    from codemill.repos.taskset import TaskSet
    from codemill.store import ArtifactStore

    out = Path(args.out)
    base = PipelineConfig.model_validate(_read(Path(args.config)))
    t0 = time.monotonic()
    built = repo_tasks(config=base)["stages"]["repo_tasks"]["ref"]
    store = ArtifactStore(base.store_root)
    root = store.local_path(store.ref("repo_tasks", built["name"], built["digest"]))
    taskset = TaskSet(root)
    train = [RepoProblem.of(t, root) for t in taskset.tasks("train")]
    rng = random.Random(args.seed)
    docs = []
    for p in train:
        snapshot = taskset.snapshot(p.task)
        env = taskset.env(p.task, snapshot)
        docs.append(trajectory(p, snapshot, env, "fix"))
        if rng.random() < args.noise:
            docs.append(trajectory(p, snapshot, env, rng.choice(["wrong", "idle"])))
    print(json.dumps({"train_tasks": len(train), "val_tasks": len(taskset.tasks("val")), "documents": len(docs),
                      "chars_mean": sum(map(len, docs)) / len(docs), "setup_s": round(time.monotonic() - t0, 1)}),
          flush=True)
    policy = out / "base"
    if not (policy / "config.json").is_file():  # a rerun into the same --out starts from the same base policy
        start = scratch_policy(out / "init", docs, 1024, ModelConfig(), max_len=4096, seed=args.seed)
        pretrain(start, policy, docs, args.pretrain_steps, seed=args.seed)

    cfg = base.model_copy(deep=True)
    cfg.rl = cfg.rl.model_validate({
        "iterations": args.iterations, "seed": args.seed, "heldout_samples": args.k,
        "warm_start": {"max_steps": 0},
        "algorithm": {"name": "grpo", "lr": args.lr, "micro_batch_size": 8, "grad_accum": 2, "epochs": 2,
                      "norm_adv_by_std": False, "device": "cpu"},
        "env": {"kind": "repo", "max_turns": 3, "tools_prompt": "brief", "tests_s": 120},
        "rollout": {"problems_per_iteration": len(train), "samples_per_problem": args.k, "max_new_tokens": 192,
                    "context_len": 4096, "stop": [END_OF_TURN], "workers": 2, "temperature": 1.0}})
    cfg.evaluate.suites = []
    cfg.gate.enabled = False
    result = rl(config=cfg, model=str(policy))
    for row in result["iterations"]:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    print(json.dumps({"heldout": result["heldout"], "model_id": result["model_id"],
                      "wall_s": round(time.monotonic() - t0, 1)}), flush=True)


def _read(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text())


if __name__ == "__main__":
    main()
