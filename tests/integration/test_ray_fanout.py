"""Ingest and tokenize fanned out on a local Ray cluster give the same artifacts as the in-process run."""

from __future__ import annotations

from pathlib import Path

import pytest

from codemill.config import PipelineConfig
from codemill.flows.common import with_task_runner
from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config
from tests.integration.stage_flows import data_stages
from tests.integration.store_checks import committed_artifacts

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]


def _config(corpus: Path, tmp: Path, ray: bool) -> PipelineConfig:
    cfg = small_pipeline_config(corpus, tmp)
    cfg.ingest.chunk_files = 40  # several chunks, so there is something to fan out
    cfg.ingest.shard_max_rows = 25  # and several train shards to encode
    if ray:
        cfg.ray_address = "local"
        cfg.ray_init = {"num_cpus": 2, "object_store_memory": 100 * 2**20, "include_dashboard": False}
    return cfg


def _unit_runs() -> list[str]:
    """States of the fan-out task runs the Prefect server has seen (one per ingest chunk and tokenize shard)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="unit-")))
    return [r.state_name for r in runs]


def _files(store: ArtifactStore, ref: dict) -> dict[str, tuple[int, str]]:
    """Every file of a committed artifact: path -> (bytes, sha256), as its manifest records them."""
    m = store.read_manifest(ArtifactRef(**ref))
    return {f.path: (f.bytes, f.sha256) for f in m.files}


def test_ray_fanout_matches_single_process(small_corpus: Path, tmp_path: Path) -> None:
    single_cfg = _config(small_corpus, tmp_path / "single", ray=False)
    ray_cfg = _config(small_corpus, tmp_path / "ray", ray=True)
    before = len(_unit_runs())
    single = data_stages(single_cfg)
    assert len(_unit_runs()) == before  # in-process: no task run per unit
    on_ray = with_task_runner(data_stages, ray_cfg)(ray_cfg)
    units = _unit_runs()
    assert len(units) - before >= 3 and set(units) == {"Completed"}  # every chunk and shard ran as a Ray task
    import ray

    assert not ray.is_initialized()  # the runner started the local cluster and shut it down again
    s_store, r_store = ArtifactStore(single_cfg.store_root), ArtifactStore(ray_cfg.store_root)
    # Both stores read back byte by byte: every file of every artifact is the one its manifest lists.
    assert len(committed_artifacts(s_store)) >= 4 and len(committed_artifacts(r_store)) >= 4
    for stage in ("ingest", "tokenizer", "tokenize"):
        # Not a finding: ray_address/ray_init are runtime-only, so both runs plan the same digests by
        # construction. What the fan-out could get wrong is the bytes, compared next.
        assert on_ray[stage]["digest"] == single[stage]["digest"]
        s_files, r_files = _files(s_store, single[stage]), _files(r_store, on_ray[stage])
        assert s_files, stage
        differ = sorted(p for p in s_files.keys() | r_files.keys() if s_files.get(p) != r_files.get(p))
        assert differ == [], f"{stage}: files differ between the Ray and the in-process run: {differ}"
    assert s_store.read_manifest(ArtifactRef(**single["ingest"])).stats["chunks"]["total"] > 1
    assert len([p for p in _files(s_store, single["ingest"]) if p.startswith("train/")]) > 1
    assert len([p for p in _files(s_store, single["tokenize"]) if p.startswith("train/")]) > 1
