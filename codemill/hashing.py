"""Content hashing and digests: the identity of every artifact in the store."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace variance, so equal values hash equally."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def digest_of(obj: Any) -> str:
    return sha256_bytes(canonical_json(obj).encode("utf-8"))


def stage_digest(stage: str, code_version: str, config: Any, inputs: dict[str, str]) -> str:
    """digest = sha256(stage, stage code version, output-affecting config, input artifact digests)."""
    return digest_of({"stage": stage, "code_version": code_version, "config": config, "inputs": inputs})


def combine_digests(items: list[tuple[str, str]]) -> str:
    """Order-independent digest of (name, digest) pairs: sorted, then hashed."""
    h = hashlib.sha256()
    for name, dig in sorted(items):
        h.update(name.encode("utf-8"))
        h.update(b"\0")
        h.update(dig.encode("ascii"))
        h.update(b"\n")
    return h.hexdigest()
