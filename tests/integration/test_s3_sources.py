"""Parquet and JSONL sources on S3: a local moto server over real HTTP, read through s3fs."""

from __future__ import annotations

import io
import json

import polars as pl
import pytest

from codemill.data.config import IngestConfig
from codemill.data.ingest import fingerprint_sources, run_ingest
from codemill.data.sources import SourceError, plan_chunks
from codemill.data.sources.jsonl import JsonlSource
from codemill.data.sources.parquet import ParquetSource
from tests.conftest import s3_bucket, start_moto_server

pytestmark = pytest.mark.integration
CODE = "def f{i}(x):\n    total = x * {i} + 3\n    return total - {i} // 2\n"


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch):
    return s3_bucket(s3_endpoint, monkeypatch, "corpus-src")


def test_parquet_and_jsonl_on_s3_are_ingested(s3_env, tmp_path):
    buf = io.BytesIO()
    pl.DataFrame({"content": [CODE.format(i=i) for i in range(6)], "path": [f"p{i}.py" for i in range(6)],
                  "repo": ["org/a"] * 3 + ["org/b"] * 3}).write_parquet(buf, row_group_size=2)
    s3_env.put_object(Bucket="corpus-src", Key="pq/part-0.parquet", Body=buf.getvalue())
    lines = [json.dumps({"content": CODE.format(i=100 + i), "path": f"j{i}.py"}) for i in range(3)] + ["{oops"]
    s3_env.put_object(Bucket="corpus-src", Key="js/rows.jsonl", Body="\n".join(lines).encode())
    cfg = IngestConfig(sources=[ParquetSource(path="s3://corpus-src/pq/*.parquet"),
                                JsonlSource(path="s3://corpus-src/js/", repo="org/j")],
                       val_fraction=0.0, chunk_files=2, decontamination={"enabled": False})
    fps = fingerprint_sources(cfg)
    assert [f["files"] for f in fps] == [1, 1] and all(len(f["fingerprint"]) == 64 for f in fps)
    assert len(plan_chunks(0, cfg.sources[0], 2)) == 3  # one chunk per 2-row row group
    st = run_ingest(cfg, tmp_path / "out")
    assert st["files_seen"] == 10 and st["files_kept"] == 9 and st["rejected_by_reason"] == {"invalid_json": 1}
    rows = pl.read_parquet(tmp_path / "out" / "train" / "*.parquet")
    assert sorted(set(rows["repo"])) == ["org/a", "org/b", "org/j"]
    s3_env.put_object(Bucket="corpus-src", Key="js/rows.jsonl", Body="\n".join(lines[:2]).encode())
    assert fingerprint_sources(cfg)[1]["fingerprint"] != fps[1]["fingerprint"]  # ETag changed


def test_a_missing_bucket_is_a_clear_error(s3_env):
    with pytest.raises(SourceError, match=r"s3://no-such-bucket-here/x/\*.parquet.*(not exist|not found|no files)"):
        fingerprint_sources(IngestConfig(sources=[ParquetSource(path="s3://no-such-bucket-here/x/*.parquet")]))


def test_wrong_credentials_are_a_clear_error(monkeypatch):
    import boto3

    proc, url = start_moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "3"})  # this server checks signatures
    try:
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        iam = boto3.client("iam", endpoint_url=url, aws_access_key_id="x", aws_secret_access_key="x")
        iam.create_user(UserName="reader")
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        iam.put_user_policy(UserName="reader", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id=key["AccessKeyId"],
                          aws_secret_access_key=key["SecretAccessKey"])
        s3.create_bucket(Bucket="locked")
        s3.put_object(Bucket="locked", Key="rows.jsonl", Body=b'{"content": "x = 1"}\n')
        src = JsonlSource(path="s3://locked/rows.jsonl", storage_options={
            "key": key["AccessKeyId"], "secret": "not-the-secret", "endpoint_url": url})
        with pytest.raises(SourceError, match=r"s3://locked/rows.jsonl.*access denied \(check the credentials\)"):
            fingerprint_sources(IngestConfig(sources=[src]))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
