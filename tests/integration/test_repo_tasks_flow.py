"""The repo_tasks stage through Prefect and MLflow: imported and synthesised tasks validated in the sandbox, split
by repository, bundled with their snapshots into one content-addressed artifact that grades without the source
repositories; a rerun is skipped."""

from __future__ import annotations

import json

from codemill.lineage import mlflow_digest
from codemill.repos import git
from codemill.repos.evaluate import grade_predictions
from codemill.repos.sources.imported import ImportedRepoTasksConfig
from codemill.repos.sources.synthesized import RepositoryConfig, SynthesizedRepoTasksConfig
from codemill.repos.task import Prediction, write_tasks
from codemill.repos.taskset import TaskSet
from tests.integration.helpers import small_pipeline_config
from tests.integration.repo_fixture import make_repo


def test_repo_tasks_stage_builds_validated_tasks_with_lineage(prefect_harness, tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("CODEMILL_REPO_CACHE", str(tmp_path / "repo-cache"))  # the stage's cache, not the user's
    from codemill.flows.repo_tasks import repo_tasks
    from codemill.repos.cache import RepoCache

    repos = tmp_path / "repos"
    repo, task = make_repo(repos)
    broken = task.__class__(**{**task.__dict__, "instance_id": "mathlib__broken-2",
                               "patch": task.patch.replace("return hi", "return lo + 0")})
    tasks_file = tmp_path / "imported.jsonl"
    write_tasks([task, broken], tasks_file)
    cfg = small_pipeline_config(tmp_path / "corpus", tmp_path)
    cfg.repo_tasks.sources = [
        ImportedRepoTasksConfig(tasks=str(tasks_file), repos=str(repos)),
        SynthesizedRepoTasksConfig(repositories=[RepositoryConfig(name="mathlib-synth", path=str(repo))],
                                   per_operator=2)]
    cfg.repo_tasks.val_fraction = 0.5
    out = repo_tasks(config=cfg)
    result = out["stages"]["repo_tasks"]
    summary = result["summary"]
    assert result["status"] == "ran"
    assert summary["repositories"] == ["mathlib-repo", "mathlib-synth"] and summary["tasks"] >= 3
    assert sum(summary["by_operator"].values()) == summary["tasks"] - 1
    root = tmp_path / "store" / "repo_tasks" / result["ref"]["uri"].rstrip("/").rsplit("/", 1)[-1]
    manifest = json.loads((root / "manifest.json").read_text())
    head = git.git(repo, "rev-parse", "HEAD").strip()
    assert manifest["inputs"]["source.1.mathlib-synth"] == head
    imported = manifest["stats"]["yield"][0]
    assert imported["read"] == 2 and imported["validated"] == 1 and imported["dropped"] == {"gold patch fails": 1}

    # Self-contained: graded from the artifact's bundles in a fresh cache, no source repository needed.
    repo.rename(tmp_path / "moved-away")
    taskset = TaskSet(root, RepoCache(tmp_path / "fresh-cache"))
    built = taskset.tasks()
    assert {t.split for t in built} <= {"train", "val"}
    assert len({t.split for t in built if t.repo == "mathlib-synth"}) == 1, "a repository is split whole"
    for t in built:
        snapshot = taskset.snapshot(t)
        assert (snapshot / ".git").is_dir() and not (snapshot / "tests" / "test_clamp.py").exists()
    preds = [Prediction(t.instance_id, "gold", t.patch) for t in built]
    report = grade_predictions(built, preds, root, taskset.cache, taskset=taskset)
    assert report["resolved_ids"] == sorted(t.instance_id for t in built)

    client = mlflow.MlflowClient(cfg.mlflow_tracking_uri)
    run = client.get_run(result["run_id"])
    assert run.data.tags["codemill.repo_source.source.1.mathlib-synth"] == f"mathlib-synth@{head}"
    assert run.data.metrics["tasks"] == summary["tasks"]
    (output,) = [d for d in run.inputs.dataset_inputs if d.dataset.name == "repo_tasks"]
    assert output.dataset.digest == mlflow_digest(result["ref"]["digest"])

    repo_back = tmp_path / "moved-away"
    repo_back.rename(repo)
    again = repo_tasks(config=cfg)["stages"]["repo_tasks"]
    assert again["status"] in ("cached", "present") and again["ref"]["digest"] == result["ref"]["digest"]
