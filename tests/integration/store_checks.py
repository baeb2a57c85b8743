"""Checks shared by the real-server tests: an S3 store on the moto server, and that every artifact is whole."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from codemill.store import MANIFEST, ArtifactStore, Manifest


def use_s3(monkeypatch: pytest.MonkeyPatch, endpoint: str, bucket: str) -> str:
    """Point boto3/s3fs at the moto server (as a deployment points them at S3) and create ``bucket``."""
    import boto3

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/store"


def committed_artifacts(store: ArtifactStore, *, allow_uncommitted: bool = False) -> dict[str, Manifest]:
    """Every artifact folder in the store, read back byte by byte: its manifest lists exactly the files there,
    with their sizes and sha256. A folder without a manifest (an interrupted upload, never read) is allowed
    only with ``allow_uncommitted``; a manifest next to a missing or different file never is."""
    fs, out = store.fs, {}
    for folder in fs.glob(f"{store.root}/*/*"):
        if not fs.isdir(folder):
            continue
        if not fs.exists(f"{folder}/{MANIFEST}"):
            assert allow_uncommitted, f"{folder} has no manifest"
            continue
        with fs.open(f"{folder}/{MANIFEST}", "r") as fh:
            manifest = Manifest.model_validate_json(fh.read())
        for entry in manifest.files:
            with fs.open(f"{folder}/{entry.path}", "rb") as fh:
                data = fh.read()
            assert len(data) == entry.bytes, f"{folder}/{entry.path}: {len(data)} bytes, manifest says {entry.bytes}"
            assert hashlib.sha256(data).hexdigest() == entry.sha256, f"{folder}/{entry.path}: sha256 differs"
        listed = {e.path for e in manifest.files} | {MANIFEST}
        present = {p[len(folder) + 1:] for p in fs.find(folder)}
        assert present == listed, f"{folder}: files not in its manifest {present - listed}"
        out[f"{manifest.stage}/{manifest.name}"] = manifest
    return out


def staging_leftovers(work_dir: str | Path) -> list[Path]:
    """Local staging folders (a remote store's payloads are built under the work dir's cache first)."""
    cache = Path(work_dir) / "cache"
    return [p for p in cache.rglob("*") if p.is_dir() and p.name.startswith(("staging-", ".staging-"))]
