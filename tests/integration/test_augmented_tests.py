"""Augmented HumanEval tests through the real sandbox: the augment stage under Prefect builds the tiny preset's
artifact and a rerun finds it (cache hit); the build is what the package ships, and a new store takes the
shipped copy instead of building; every canonical solution passes its augmented tests in the judge pool
evaluation uses; a known-wrong solution that passes the original tests fails the augmented ones; the problems
stage's ``augment`` option strengthens a verified problem set with the same function."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import polars as pl
import pytest
from mlflow import MlflowClient
from prefect import flow

from codemill.config import PipelineConfig
from codemill.evals.humaneval import execute
from codemill.flows.run import open_run, run_stage_task
from codemill.lineage import tags as T
from codemill.plan import manifest_digest
from codemill.problems.config import AugmentConfig, ProblemsConfig, ProblemSourceConfig
from codemill.problems.humaneval import load_problems, problems_file
from codemill.problems.plus.artifact import plan_augment, read_augmented
from codemill.problems.plus.counts import COUNTS_FILE, read_counts
from codemill.problems.plus.shipped import SHIPPED_FROM, find_shipped, read_shipped_manifest
from codemill.problems.problem import ExecProblem
from codemill.problems.sets import PROBLEMS_FILE, read_problem_set
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool
from codemill.ship_augmented import preset_augment
from codemill.store import ArtifactRef, ArtifactStore
from codemill.tasks.augment import augment_task

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]

IDS = ("HumanEval/18", "HumanEval/34", "HumanEval/40")
# Every kept input (no reduction), for the problems stage's option below.
SMALL = AugmentConfig(max_inputs=24, rounds=2, max_mutants=12, reduce=False, workers=2)
# The shipped counts a rebuild must repeat: all but the mutant kill counts, in which a mutant slower than its
# wall-clock budget counts as killed (so on a loaded machine a few more are).
KILLS = ("killed_by_kept", "killed_by_original", "killed_by_augmented")
# unique(l): "sorted unique elements". set() of small ints iterates in sorted order by accident, so the original
# tests' one call passes; a mutated input with a large element exposes it (a classic wrong solution).
WRONG_UNIQUE = "    return list(set(l))\n"


@flow(name="augment-test", persist_result=True)
def augment_flow(config: PipelineConfig, path: str) -> dict:
    with open_run(config, "augment-test", tag=False) as run:
        result = run_stage_task(augment_task, run.store, plan=plan_augment(config.augment, path), ctx=run.ctx,
                                cfg=config.augment)
        run.finish({})
    return result.model_dump()


def _config(tmp: Path, name: str, augment: AugmentConfig) -> PipelineConfig:
    home = tmp / name
    home.mkdir(parents=True, exist_ok=True)
    return PipelineConfig(name=f"test-{tmp.name}-{name}", store_root=str(home / "store"), work_dir=str(home / "work"),
                          mlflow_tracking_uri=f"sqlite:///{home / 'mlflow.db'}", augment=augment)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny preset's augment step (what ``codemill run`` plans) built in the sandbox with the shipped copy
    refused, then again (a cache hit); and the same step in a new store, which takes the shipped copy."""
    tmp = tmp_path_factory.mktemp("augment")
    found = preset_augment("tiny")
    assert found is not None
    plan, tiny = found
    cfg = _config(tmp, "built", tiny.model_copy(update={"shipped": False, "workers": 2}))
    first = augment_flow(config=cfg, path=problems_file())
    second = augment_flow(config=cfg, path=problems_file())
    shipped_cfg = _config(tmp, "shipped", tiny)
    shipped = augment_flow(config=shipped_cfg, path=problems_file())
    store = ArtifactStore(cfg.store_root)
    return {"first": first, "second": second, "shipped": shipped, "plan": plan, "cfg": cfg,
            "shipped_cfg": shipped_cfg, "dir": store.local_path(store.ref_for(plan))}


def test_the_artifact_is_built_once_and_found_on_a_rerun(built):
    first, second, plan = built["first"], built["second"], built["plan"]
    assert first["status"] == "ran" and second["status"] in ("cached", "present")
    assert second["run_id"] == first["run_id"]  # the rerun recorded nothing new: it found the artifact
    assert first["ref"]["digest"] == second["ref"]["digest"] == plan.digest
    assert first["summary"]["problems"] == 164
    counts = {r["problem_id"]: r for r in read_counts(built["dir"])}
    assert (built["dir"] / COUNTS_FILE).exists() and set(IDS) <= set(counts)
    assert SHIPPED_FROM not in ArtifactStore(built["cfg"].store_root).read_manifest(
        ArtifactRef.model_validate(first["ref"])).stats
    assert first["summary"]["reference_passes"] == sum(1 for r in counts.values() if r["seeded"]) > 150
    for r in (counts[i] for i in IDS):
        assert r["kept"] > 0 and r["generated"] >= r["kept"] and r["mutants"] >= 1
        assert r["killed_by_original"] <= r["killed_by_augmented"] <= r["mutants"]
    assert sum(r["killed_by_augmented"] - r["killed_by_original"] for r in counts.values()) >= 10
    # another config is another artifact
    aug = built["cfg"].augment
    assert plan_augment(aug.model_copy(update={"seed": 1})).digest != first["ref"]["digest"]
    assert plan_augment(aug.model_copy(update={"workers": 1, "shipped": True})).digest == first["ref"]["digest"]


def test_the_build_is_what_the_package_ships(built):
    """Fails when the augmentation's output changed without a new code version: the shipped copy would then be
    stale. Run ``python -m codemill.ship_augmented``, commit, and bump ``PLUS_CODE_VERSION``."""
    path = find_shipped(built["plan"])
    assert path is not None, "no shipped artifact for this digest: run python -m codemill.ship_augmented"
    assert read_shipped_manifest(path).digest == built["first"]["ref"]["digest"]
    with zipfile.ZipFile(path) as z:
        problems = pl.read_parquet(io.BytesIO(z.read(PROBLEMS_FILE)))
        counts = pl.read_parquet(io.BytesIO(z.read(COUNTS_FILE)))
    assert pl.read_parquet(built["dir"] / PROBLEMS_FILE).equals(problems)  # the tests evaluation runs, exactly
    assert pl.read_parquet(built["dir"] / COUNTS_FILE).drop(KILLS).equals(counts.drop(KILLS))


def test_a_new_store_takes_the_shipped_copy_and_records_it(built):
    result, cfg = built["shipped"], built["shipped_cfg"]
    assert result["status"] == "ran" and result["ref"]["digest"] == built["plan"].digest
    store = ArtifactStore(cfg.store_root)
    manifest = store.read_manifest(ArtifactRef.model_validate(result["ref"]))
    path = find_shipped(built["plan"])
    assert path is not None and manifest.stats[SHIPPED_FROM] == path.name
    assert manifest.files == read_shipped_manifest(path).files and manifest_digest(manifest) == manifest.digest
    assert manifest.uri == result["ref"]["uri"] and manifest.input_uris == {"humaneval": problems_file()}
    assert read_augmented(store.local_path(store.ref_for(built["plan"]))) == read_augmented(built["dir"])
    run = MlflowClient(cfg.mlflow_tracking_uri).get_run(result["run_id"])
    assert run.data.tags[T.SHIPPED] == path.name and run.data.tags[T.OUTPUT_DIGEST] == built["plan"].digest
    assert run.data.metrics["problems"] == 164


def test_canonical_passes_and_a_wrong_solution_fails_only_the_augmented_tests(built):
    augmented = read_augmented(built["dir"])
    original = load_problems()
    assert all("_plus_original_check(candidate)" in augmented[k].tests for k in IDS)
    assert all(len(augmented[k].test_cases) > 1 for k in IDS)
    canonical = [{"task_id": k, "completion": original[k].reference_solution} for k in IDS]
    wrong = [{"task_id": "HumanEval/34", "completion": WRONG_UNIQUE}]
    with JudgePool(Limits(), workers=2) as pool:
        assert all(r.passed for r in execute(augmented, canonical, pool))
        assert execute(original, wrong, pool)[0].passed
        on_plus = execute(augmented, wrong, pool)[0]
        assert not on_plus.passed and on_plus.outcome == "failed"
        scored = pool.judge_all([augmented["HumanEval/34"].request(WRONG_UNIQUE)])[0]
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
        assert pool.judge_all([original.request(wrong)])[0].passed
        assert not pool.judge_all([p.request(wrong)])[0].passed
