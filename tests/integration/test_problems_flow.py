"""The problems flow under Prefect: a HumanEval-format JSONL file (a good problem, one whose reference fails, a
duplicate) plus the synthetic family -> one committed artifact with counts per source and step, an MLflow
dataset, a cache hit on the rerun, a new digest when the file changes, and no artifact from a malformed file."""

from __future__ import annotations

import json

import polars as pl
import pytest
from mlflow import MlflowClient

from codemill.lineage import mlflow_digest
from codemill.plan import manifest_digest
from codemill.problems.config import ProblemSourceConfig
from codemill.problems.sets import ProblemFileError
from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]

GOOD = {"task_id": "file/0", "prompt": "def double(x):\n    \"\"\"Return twice x.\"\"\"\n", "entry_point": "double",
        "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == -6\n",
        "canonical_solution": "    return 2 * x\n"}
FAILING = {**GOOD, "task_id": "file/1", "prompt": "def triple(x):\n    \"\"\"Return three times x.\"\"\"\n",
           "entry_point": "triple", "test": "def check(candidate):\n    assert candidate(2) == 6\n",
           "canonical_solution": "    return 2 * x\n"}
DUPLICATE = {**GOOD, "task_id": "file/2", "prompt": GOOD["prompt"] + "\n"}


def _config(tmp_path, lines: list[str]):
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    cfg = small_pipeline_config(tmp_path, tmp_path)
    cfg.problems.sources = [ProblemSourceConfig(kind="jsonl", path=str(path)),
                            ProblemSourceConfig(kind="synthetic", seed=1, count=26)]
    cfg.problems.val_fraction = 0.3
    cfg.problems.workers = 2
    return cfg, path


def test_problems_flow_commits_counts_and_logs_a_dataset(tmp_path):
    from codemill.flows.problems import problems

    cfg, path = _config(tmp_path, [json.dumps(r) for r in (GOOD, FAILING, DUPLICATE)])
    out = problems(config=cfg)
    result = out["stages"]["problems"]
    assert result["status"] == "ran"
    counts = result["summary"]["by_source"]
    assert {k: v for k, v in counts["problems.jsonl"].items() if k not in ("train", "val")} == {
        "kind": "jsonl", "read": 3, "malformed": 0, "reference_failed": 1, "unverified": 0, "duplicate": 1,
        "contaminated": 0, "kept": 1}
    assert counts["synthetic"]["read"] == counts["synthetic"]["kept"] == 26
    assert counts["synthetic"]["train"] > 0 and counts["synthetic"]["val"] > 0
    assert result["summary"]["problems"] == 27

    store = ArtifactStore(cfg.store_root)
    ref = ArtifactRef.model_validate(result["ref"])
    manifest = store.read_manifest(ref)
    assert manifest_digest(manifest) == ref.digest  # the manifest says what was hashed
    assert {f.path for f in manifest.files} == {"problems.parquet", "rejected.parquet"}
    assert list(manifest.inputs) == ["source.0.problems.jsonl"]
    kept = pl.read_parquet(store.local_path(ref) / "problems.parquet")
    assert kept["problem_id"].to_list()[0] == "file/0" and kept.height == 27
    assert set(kept.filter(pl.col("source") == "synthetic")["split"]) == {"train", "val"}
    rejected = pl.read_parquet(store.local_path(ref) / "rejected.parquet")
    assert sorted(zip(rejected["problem_id"], rejected["reason"], strict=True)) == [
        ("file/1", "reference_failed"), ("file/2", "duplicate")]

    client = MlflowClient(cfg.mlflow_tracking_uri)
    run = client.get_run(result["run_id"])
    datasets = {d.dataset.name: d.dataset.digest for d in run.inputs.dataset_inputs}
    assert datasets == {"problems": mlflow_digest(ref.digest)}
    assert run.data.metrics["problems"] == 27 and run.data.metrics["total.reference_failed"] == 1
    assert run.data.tags["codemill.problem_source.0.name"] == "problems.jsonl"

    again = problems(config=cfg)["stages"]["problems"]
    assert again["status"] in ("cached", "present") and again["ref"] == result["ref"]

    path.write_text(json.dumps(GOOD) + "\n")  # a changed file is a new problem set
    changed = problems(config=cfg)["stages"]["problems"]
    assert changed["status"] == "ran" and changed["ref"]["digest"] != ref.digest
    assert changed["summary"]["by_source"]["problems.jsonl"]["read"] == 1


def test_a_malformed_line_fails_the_flow_and_leaves_no_artifact(tmp_path):
    from codemill.flows.problems import problems

    cfg, path = _config(tmp_path, [json.dumps(GOOD), '{"task_id": "file/9", "prompt": "def f('])
    with pytest.raises(ProblemFileError, match=rf"{path}:2: not valid JSON"):
        problems(config=cfg)
    assert not [p for p in (tmp_path / "store" / "problems").iterdir() if not p.name.startswith(".")]


MODULE = '''"""Small helpers."""


def clamp(x, lo, hi):
    """Clamp x into [lo, hi].

    >>> clamp(5, 0, 3)
    3
    >>> clamp(-1, 0, 3)
    0
    """
    return max(lo, min(x, hi))


def wrong_square(x):
    """The square of x, documented wrongly.

    >>> wrong_square(3)
    10
    """
    return x * x
'''


def test_doctests_are_mined_from_the_ingested_corpus(tmp_path):
    from codemill.data.sources import FolderSource
    from codemill.flows.problems import problems

    corpus = tmp_path / "src" / "helpers"
    corpus.mkdir(parents=True)
    (corpus / "numeric.py").write_text(MODULE)
    (corpus / "m0.py").write_text(MODULE.replace("clamp", "clamp_m0").replace("wrong_square", "wrong_square_m0"))
    cfg = small_pipeline_config(corpus, tmp_path)
    cfg.ingest.sources = [FolderSource(path=str(corpus), repo="org/helpers")]
    cfg.ingest.val_fraction = 0.5  # m0.py lands in val, numeric.py in train (a salted hash of the module name)
    cfg.problems.sources = [ProblemSourceConfig(kind="mined")]
    cfg.problems.workers = 2
    out = problems(config=cfg)
    assert list(out["stages"]) == ["ingest", "problems"]
    corpus_ref = out["stages"]["ingest"]["ref"]
    result = out["stages"]["problems"]
    counts = result["summary"]["by_source"]["mined"]
    assert (counts["read"], counts["reference_failed"], counts["kept"]) == (4, 2, 2)
    assert counts["mining"]["files"] == 2 and counts["mining"]["kept"] == 4
    store = ArtifactStore(cfg.store_root)
    manifest = store.read_manifest(ArtifactRef.model_validate(result["ref"]))
    assert manifest.inputs == {"corpus": corpus_ref["digest"]}
    kept = pl.read_parquet(store.local_path(ArtifactRef.model_validate(result["ref"])) / "problems.parquet"
                           ).sort("entry_point").to_dicts()
    corpus_dir = store.local_path(ArtifactRef.model_validate(corpus_ref))
    corpus_split = {path: split for split in ("train", "val")
                    for path in pl.read_parquet(corpus_dir / split / "*.parquet")["path"]}
    assert corpus_split == {"numeric.py": "train", "m0.py": "val"}
    # a mined problem's split is its file's corpus split: a val problem's solution was never trained on
    assert [(k["entry_point"], k["split"], k["split_unit"], k["verified"]) for k in kept] == [
        ("clamp", "train", "train:org/helpers/numeric.py", True), ("clamp_m0", "val", "val:org/helpers/m0.py", True)]
    run = MlflowClient(cfg.mlflow_tracking_uri).get_run(result["run_id"])
    assert {d.dataset.name for d in run.inputs.dataset_inputs} == {"corpus", "problems"}
