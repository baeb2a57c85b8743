"""GRPO on repository tasks through the ``rl`` flow: the flow builds the ``repo_tasks`` artifact (an imported task
and bug-injected ones, split by repository), samples multi-turn agent episodes from a tiny policy in the ``repo``
environment, logs each iteration's agent numbers (resolved rate, turns, tool calls by tool, tool errors, tokens,
limits hit, suspicious, environment vs generation time), and ``codemill lineage`` walks the checkpoint down to the
repository commits its tasks start from.

The tiny policy cannot fix code: its turns hold no tool call, every episode ends on its turns, and the update
trains on nothing (every group's rewards are equal). That is the plumbing this test shows, not learning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from codemill.config import PipelineConfig
from codemill.repos import git
from codemill.repos.config import RepoTasksConfig
from codemill.repos.sources.imported import ImportedRepoTasksConfig
from codemill.repos.sources.synthesized import RepositoryConfig, SynthesizedRepoTasksConfig
from codemill.repos.task import write_tasks
from codemill.rl.envs.repo import END_OF_TURN
from codemill.rl.trajectory import read_rollouts
from codemill.store import ArtifactStore
from tests.integration.repo_fixture import make_repo
from tests.integration.rl_setup import rl_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]
ROOT = Path(__file__).resolve().parents[2]
CODEMILL = Path(sys.executable).parent / "codemill"


def _config(root: Path) -> PipelineConfig:
    repos = root / "repos"
    repo, task = make_repo(repos)
    write_tasks([task], root / "imported.jsonl")
    cfg = rl_config(root, iterations=1, heldout_samples=1, warm_start={"max_steps": 0},
                    algorithm={"name": "grpo", "lr": 1e-4, "micro_batch_size": 4, "device": "cpu"},
                    env={"kind": "repo", "max_turns": 2, "tools_prompt": "brief", "tests_s": 60},
                    rollout={"problems_per_iteration": 3, "samples_per_problem": 2, "max_new_tokens": 24,
                             "context_len": 2048, "stop": [END_OF_TURN], "workers": 2})
    cfg.evaluate.suites = ["repo_tasks"]  # the final policy on the held-out repository's tasks
    cfg.evaluate.repo_tasks.env = cfg.rl.env
    cfg.evaluate.repo_tasks.max_new_tokens = 24
    cfg.evaluate.repo_tasks.context_len = 2048
    cfg.repo_tasks = RepoTasksConfig(
        sources=[ImportedRepoTasksConfig(tasks=str(root / "imported.jsonl"), repos=str(repos)),
                 SynthesizedRepoTasksConfig(repositories=[RepositoryConfig(name="mathlib-synth", path=str(repo))],
                                            per_operator=1)],
        val_fraction=0.5, split_salt="repo-rl-test")
    return cfg


def test_grpo_on_repository_tasks_logs_agent_metrics_and_traces_to_the_commit(tmp_path, monkeypatch):
    from codemill.flows.rl import rl
    from tests.tiny_policy import make_policy

    monkeypatch.setenv("CODEMILL_REPO_CACHE", str(tmp_path / "repo-cache"))
    cfg = _config(tmp_path)
    path = tmp_path / "repo-rl.json"
    path.write_text(cfg.model_dump_json())
    start = make_policy(tmp_path / "start", max_len=2048)
    out = rl(config=cfg, model=str(start))
    stages, store = out["stages"], ArtifactStore(cfg.store_root)
    assert stages["repo_tasks"]["status"] == "ran"
    (row,) = out["iterations"]
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
    assert row["pass_rate"] == 0.0 and row["turns_mean"] == 2.0 and row["limits_hit_frac"] == 1.0
    assert row["tool_calls_mean"] == 0.0 and row["suspicious"] == 0
    assert row["tokens_per_episode_mean"] > 2 * 24 and 0 < row["observed_token_frac"] < 1
    assert row["env_s"] > 0 and row["generation_s"] > 0
    assert row["groups_kept"] == 0, "equal rewards in every group: nothing to train on"

    suite = out["evals"]["repo_tasks"]
    assert suite["repo_tasks_resolved"] == 0.0 and suite["repo_tasks_tasks"] >= 1
    assert suite["repo_tasks_limits_hit"] == suite["repo_tasks_episodes"] == suite["repo_tasks_tasks"]
    assert suite["repo_tasks_resolved_ci_low"] <= suite["repo_tasks_resolved"] <= suite["repo_tasks_resolved_ci_high"]

    ref = stages["rollouts:0"]["ref"]
    rows = read_rollouts(store.local_path(store.ref("rollouts", ref["name"], ref["digest"]))).to_pylist()
    assert {r["finish_reason"] for r in rows} == {"max_turns"} and {r["outcome"] for r in rows} == {"unresolved"}
    assert row["finish_reasons.max_turns"] == len(rows) == 2 * len({r["problem_id"] for r in rows})
    assert all(json.loads(r["env_stats"])["finish"] == "max_turns" for r in rows)
    first = rows[0]
    assert first["loss_mask"][:first["turn_starts"][1]].count(0) > 0  # the answer to turn 1 is observed, mask 0

    import mlflow

    parent = mlflow.MlflowClient(cfg.mlflow_tracking_uri).get_run(out["parent_run_id"])
    assert parent.data.metrics["rl.limits_hit_frac"] == 1.0 and "rl.tokens_per_episode_mean" in parent.data.metrics

    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    lineage = subprocess.run([str(CODEMILL), "lineage", out["model_id"], "--config", str(path)], cwd=ROOT,
                             env={**env, "PREFECT_API_URL": PREFECT_API_URL.value()}, capture_output=True, text=True,
                             timeout=300)
    assert lineage.returncode == 0, lineage.stderr[-3000:]
    print(lineage.stdout)
    head = git.git(tmp_path / "repos" / "mathlib-repo", "rev-parse", "HEAD").strip()
    base = git.git(tmp_path / "repos" / "mathlib-repo", "rev-parse", "HEAD~1").strip()
    for expected in ("rollouts:it000", "repo_tasks:repo-tasks", f"mathlib-synth@{head}", f"mathlib-repo@{base}",
                     "imported.jsonl"):
        assert expected in lineage.stdout, expected
