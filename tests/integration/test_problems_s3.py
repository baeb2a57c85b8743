"""A HumanEval-format problem file on S3 (a moto server over real HTTP, read through s3fs), verified in the
sandbox like a local one; a missing bucket is a clear error."""

from __future__ import annotations

import gzip
import json

import pytest

from codemill.data.sources import SourceError
from codemill.problems.config import ProblemsConfig, ProblemSourceConfig
from codemill.problems.sets import build_problem_set, fingerprint_problem_sources
from codemill.sandbox import Limits
from codemill.sandbox.judge_pool import JudgePool
from tests.conftest import s3_bucket

pytestmark = pytest.mark.integration

ROWS = [{"task_id": f"s3/{k}", "prompt": f"def add_{k}(x):\n    \"\"\"Return x plus {k}.\"\"\"\n",
         "entry_point": f"add_{k}", "test": f"def check(candidate):\n    assert candidate(1) == {1 + k}\n",
         "canonical_solution": f"    return x + {k}\n"} for k in range(3)]


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    return s3_bucket(s3_endpoint, monkeypatch, "problems-src")


def test_a_humaneval_jsonl_on_s3_is_read_and_verified(s3, tmp_path):
    body = "".join(json.dumps(r) + "\n" for r in ROWS)
    s3.put_object(Bucket="problems-src", Key="sets/a.jsonl", Body=body.encode())
    s3.put_object(Bucket="problems-src", Key="sets/b.jsonl.gz", Body=gzip.compress(
        json.dumps({**ROWS[0], "task_id": "s3/gz", "prompt": ROWS[0]["prompt"].replace("plus", "+")}).encode()))
    cfg = ProblemsConfig(sources=[ProblemSourceConfig(kind="jsonl", path="s3://problems-src/sets/", name="s3set")])
    (fp,) = fingerprint_problem_sources(cfg)
    assert fp["files"] == 2 and len(fp["fingerprint"]) == 64
    with JudgePool(Limits(wall_s=10, cpu_s=10), workers=2) as pool:
        stats = build_problem_set(cfg, tmp_path / "out", pool.judge_all)
    assert stats["by_source"]["s3set"]["read"] == 4 and stats["by_source"]["s3set"]["kept"] == 4
    s3.put_object(Bucket="problems-src", Key="sets/a.jsonl", Body=body.encode()[:-1] + b" \n")
    assert fingerprint_problem_sources(cfg)[0]["fingerprint"] != fp["fingerprint"]


def test_a_missing_bucket_is_a_clear_error(s3):
    cfg = ProblemsConfig(sources=[ProblemSourceConfig(kind="jsonl", path="s3://no-such-problems/p.jsonl")])
    with pytest.raises(SourceError, match=r"s3://no-such-problems/p.jsonl.*(not exist|not found)"):
        fingerprint_problem_sources(cfg)
