"""Augmented HumanEval tests through the real sandbox: the augment stage under Prefect builds an artifact and a
rerun finds it (cache hit); every canonical solution passes its augmented tests in the judge pool evaluation
uses; a known-wrong solution that passes the original tests fails the augmented ones; the problems stage's
``augment`` option strengthens a verified problem set with the same function."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from prefect import flow
from prefect.runtime import flow_run

from codemill.config import AugmentConfig, PipelineConfig, ProblemsConfig, ProblemSourceConfig
from codemill.evals.humaneval import execute, load_problems, problems_file
from codemill.flows.common import open_flow_run, run_stage_task
from codemill.problems.plus.artifact import COUNTS_FILE, read_augmented, read_counts
from codemill.problems.problem import ExecProblem
from codemill.problems.sets import read_problem_set
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool
from codemill.store import ArtifactRef, ArtifactStore
from codemill.tasks.augment import augment_task, plan_augment

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]

IDS = ("HumanEval/18", "HumanEval/34", "HumanEval/40")
# Every kept input (no reduction): which inputs a reduction keeps follows the mutants, and the wrong solution
# below is not one of them; the pipeline test runs the reduction.
SMALL = AugmentConfig(max_inputs=24, rounds=2, max_mutants=12, reduce=False, workers=2)
# unique(l): "sorted unique elements". set() of small ints iterates in sorted order by accident, so the original
# tests' one call passes; a mutated input with a large element exposes it (a classic wrong solution).
WRONG_UNIQUE = "    return list(set(l))\n"


@flow(name="augment-test", persist_result=True)
def augment_flow(config: PipelineConfig, path: str) -> dict:
    store, ctx, lineage, parent = open_flow_run(config, flow_run.name or "augment-test", flow_run.id, None)
    result = run_stage_task(augment_task, store, plan=plan_augment(config.augment, path), ctx=ctx,
                            cfg=config.augment)
    lineage.end_run(parent)
    return result.model_dump()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("augment")
    path = tmp / "subset.jsonl.gz"
    with gzip.open(problems_file(), "rt") as src, gzip.open(path, "wt") as dst:
        for line in src:
            if json.loads(line)["task_id"] in IDS:
                dst.write(line)
    cfg = PipelineConfig(name=f"test-{tmp.name}", store_root=str(tmp / "store"), work_dir=str(tmp / "work"),
                         mlflow_tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", augment=SMALL)
    first = augment_flow(config=cfg, path=str(path))
    second = augment_flow(config=cfg, path=str(path))
    art = ArtifactStore(cfg.store_root).local_path(ArtifactStore(cfg.store_root).ref_for(
        plan_augment(SMALL, str(path))))
    return {"first": first, "second": second, "dir": Path(art), "path": path}


def test_the_artifact_is_built_once_and_found_on_a_rerun(built):
    first, second = built["first"], built["second"]
    assert first["status"] == "ran" and second["status"] in ("cached", "present")
    assert second["run_id"] == first["run_id"]  # the rerun recorded nothing new: it found the artifact
    assert first["ref"]["digest"] == second["ref"]["digest"]
    assert first["summary"]["problems"] == 3 and first["summary"]["reference_passes"] == 3
    counts = {r["problem_id"]: r for r in read_counts(built["dir"])}
    assert set(counts) == set(IDS) and (built["dir"] / COUNTS_FILE).exists()
    for r in counts.values():
        assert r["kept"] > 0 and r["generated"] >= r["kept"] and r["mutants"] >= 1
        assert r["killed_by_original"] <= r["killed_by_augmented"] <= r["mutants"]
    assert sum(r["killed_by_augmented"] - r["killed_by_original"] for r in counts.values()) >= 2
    # another config is another artifact
    assert plan_augment(SMALL.model_copy(update={"seed": 1}), str(built["path"])).digest != first["ref"]["digest"]
    assert plan_augment(SMALL.model_copy(update={"workers": 1}), str(built["path"])).digest == first["ref"]["digest"]


def test_canonical_passes_and_a_wrong_solution_fails_only_the_augmented_tests(built):
    augmented = read_augmented(built["dir"])
    original = {k: v for k, v in load_problems(str(built["path"])).items()}
    assert all("_plus_original_check(candidate)" in p.tests for p in augmented.values())
    assert all(len(augmented[k].test_cases) > 1 for k in IDS)
    canonical = [{"task_id": k, "completion": original[k].reference_solution} for k in IDS]
    wrong = [{"task_id": "HumanEval/34", "completion": WRONG_UNIQUE}]
    with JudgePool(Limits(), workers=2) as pool:
        assert all(r.passed for r in execute(augmented, canonical, pool))
        assert execute(original, wrong, pool)[0].passed
        on_plus = execute(augmented, wrong, pool)[0]
        assert not on_plus.passed and on_plus.outcome == "failed"
        scored = pool.judge_all([(augmented["HumanEval/34"], WRONG_UNIQUE)])[0]
        assert 0.0 < scored.partial < 1.0  # the original check passes, a new case does not


def test_the_problems_stage_option_augments_verified_problems(tmp_path):
    rec = {"task_id": "file/0", "prompt": "def unique(l: list):\n    \"\"\"Sorted unique elements.\"\"\"\n",
           "entry_point": "unique",
           "test": "def check(candidate):\n    assert candidate([3, 1, 3, 2, 30]) == [1, 2, 3, 30]\n",
           "canonical_solution": "    return sorted(set(l))\n"}
    from codemill.flows.problems import problems

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    cfg = PipelineConfig(name=f"test-{tmp_path.name}", store_root=str(tmp_path / "store"),
                         work_dir=str(tmp_path / "work"), mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    full = SMALL  # every kept input: some put an element out of hash order
    cfg.problems = ProblemsConfig(sources=[ProblemSourceConfig(kind="jsonl", path=str(path))], val_fraction=0.0,
                                  augment=full, workers=2)
    assert "augment" in cfg.problems.digest_config() and "augment" not in ProblemsConfig().digest_config()
    result = problems(config=cfg)["stages"]["problems"]
    store = ArtifactStore(cfg.store_root)
    art = store.local_path(ArtifactRef.model_validate(result["ref"]))
    stats = store.read_manifest(ArtifactRef.model_validate(result["ref"])).stats
    assert stats["augment"]["augmented"] == 1 and stats["augment"]["reference_passes"] == 1
    (p,) = read_problem_set(art / "problems.parquet")
    assert "_plus_original_check" in p.tests and len(p.test_cases) == 1 + stats["augment"]["totals"]["kept"]
    assert pl.read_parquet(art / "augment_counts.parquet").height == 1
    wrong = "    return list(set(l))\n"  # small ints iterate in order: the original test passes it
    original = ExecProblem("file/0", rec["prompt"], "unique", rec["test"])
    with JudgePool(Limits(), workers=1) as pool:
        assert pool.judge_all([(original, wrong)])[0].passed
        assert not pool.judge_all([(p, wrong)])[0].passed
