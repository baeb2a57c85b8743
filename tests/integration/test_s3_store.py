"""The pipeline with its store on S3 (a local moto server over real HTTP, through s3fs)."""

from __future__ import annotations

import pytest

from codemill.store import ArtifactRef, ArtifactStore
from tests.integration.helpers import small_pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]


def test_pipeline_on_an_s3_store(small_corpus, tmp_path, s3_endpoint, monkeypatch):
    import boto3

    from codemill.flows.pipeline import pipeline

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="codemill-test")
    cfg = small_pipeline_config(small_corpus, tmp_path, max_steps=6)
    cfg.store_root = "s3://codemill-test/store"
    cfg.evaluate.suites = ["bpb"]
    cfg.gate.enabled = False
    out = pipeline(config=cfg)
    store = ArtifactStore(cfg.store_root, cache_dir=tmp_path / "check-cache")
    for name, st in out["stages"].items():
        ref = ArtifactRef.model_validate(st["ref"])
        assert ref.uri.startswith("s3://codemill-test/store/"), name
        manifest = store.read_manifest(ref)
        for f in manifest.files:  # every file the manifest lists is in the bucket, with its size
            assert store.fs.size(f"{ref.uri}/{f.path}") == f.bytes
    again = pipeline(config=cfg)
    assert {st["status"] for st in again["stages"].values()} == {"cached"}
