"""Fixtures the integration tests share: a tiny corpus, and a small two-model pipeline run for the lineage CLI and
MLflow UI tests (one run per session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import STDLIB_MODULES
from tests.integration.cpu_load import spinning
from tests.integration.helpers import quick_pipeline_config

SPINNERS_PER_CORE = 4  # a busy machine: each sample shares its core with four processes that never sleep


def two_model_runs(corpus: Path, tmp: Path) -> dict[str, Any]:
    """Two pipeline runs on one store and tracking DB: the same data, models trained with different seeds/steps.
    Evaluation is cut to bpb + completion on a few files (humaneval has its own tests)."""
    from codemill.flows.pipeline import pipeline

    cfg = quick_pipeline_config(corpus, tmp)
    for m in cfg.gate.metrics:  # uncalibrated, one step more is within the default hold margin: the second model
        m.uncalibrated_margin = 0.0  # takes the alias on the item-level test alone, as these tests expect
    first = pipeline(config=cfg)
    cfg_b = cfg.model_copy(deep=True)
    cfg_b.train.seed, cfg_b.train.max_steps = cfg.train.seed + 1, 4
    second = pipeline(config=cfg_b)
    return {"cfg": cfg, "tmp": tmp, "first": first, "second": second}


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """A dozen stdlib modules and two small packages (~0.3 MB): for tests where the chain matters, not the model."""
    import shutil
    import sysconfig

    std, root = Path(sysconfig.get_paths()["stdlib"]), tmp_path_factory.mktemp("corpus") / "pystd-tiny"
    for pkg in ("json", "html"):
        shutil.copytree(std / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for mod in STDLIB_MODULES:
        shutil.copy2(std / mod, root / mod)
    return root


@pytest.fixture(scope="session")
def lineage_runs(prefect_harness, small_corpus, tmp_path_factory) -> dict[str, Any]:
    return two_model_runs(small_corpus, tmp_path_factory.mktemp("lineage"))


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM environment's python (tests/integration/vllm_env.py): built on first use, then cached; a failed
    build fails the test with pip's error."""
    from tests.integration.vllm_env import vllm_python as build

    try:
        return build()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def busy_cores():
    """Every usable core kept busy for the test (``cpu_load.spinning``); the spinners die with the test."""
    with spinning(SPINNERS_PER_CORE) as procs:
        yield procs
