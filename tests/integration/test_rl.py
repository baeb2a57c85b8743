"""RL for code end to end: the ``rl`` flow on the synthetic problems, from a tiny model warm-started on the train
problems' reference solutions. GRPO and rejection-sampling fine-tuning each raise the pass rate on held-out
problems (new constants and inputs of the trained kinds), significantly under the paired per-problem test; a
flow SIGKILLed between iterations resumes at the first missing iteration with no rollout skipped or repeated;
``codemill lineage`` walks an RL checkpoint back to its rollouts, sampling policy, problems and sources."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prefect.settings import PREFECT_API_URL

from codemill.evals.problem_sets import read_problem_set
from codemill.models.rl_data import iteration_problems
from codemill.store import ArtifactStore
from tests.integration.rl_setup import make_start_policy, rl_config
from tests.integration.store_checks import committed_artifacts

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]
ROOT = Path(__file__).resolve().parents[2]
CODEMILL = Path(sys.executable).parent / "codemill"
ITERATIONS = 4
SETTINGS: dict[str, Any] = {
    "iterations": ITERATIONS, "heldout_samples": 4,
    "warm_start": {"max_steps": 300, "lr": 3e-3, "micro_batch_size": 16, "seq_len": 128},
    "rollout": {"problems_per_iteration": 32, "samples_per_problem": 8, "max_new_tokens": 32, "workers": 2},
    "grpo": {"lr": 2e-4, "micro_batch_size": 8, "device": "cpu"},
    "rft": {"max_steps": 30, "lr": 1e-3, "warmup_steps": 3, "micro_batch_size": 8, "seq_len": 128},
}


@pytest.fixture(scope="module")
def rl_root(tmp_path_factory) -> Path:
    """One store for both algorithms: they share the problems, the warm start and its held-out rollouts."""
    root = tmp_path_factory.mktemp("rl")
    make_start_policy(root / "start")
    return root


def _config_file(root: Path, algorithm: str) -> Path:
    cfg = rl_config(root, **{**SETTINGS, "algorithm": algorithm})
    path = root / f"{algorithm}.yaml"
    path.write_text(cfg.model_dump_json())
    return path


def _codemill(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return subprocess.Popen([str(CODEMILL), *args], cwd=ROOT, env={**env, "PREFECT_API_URL": PREFECT_API_URL.value()},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _kill_after_first_update(proc: subprocess.Popen, store: Path, timeout: float = 900) -> None:
    """SIGKILL the whole run once iteration 0's policy is committed (iteration 1 is then under way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(store.glob("policy/grpo-it000-*/manifest.json")):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read()[-4000:] if proc.stdout else "the run ended")
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise TimeoutError("iteration 0 never committed")


def _run(root: Path, algorithm: str) -> dict[str, Any]:
    from codemill.config import PipelineConfig
    from codemill.flows.rl import rl

    cfg = PipelineConfig.model_validate_json(_config_file(root, algorithm).read_text())
    t0 = time.monotonic()
    out = rl(config=cfg, model=str(root / "start" / "hf"))
    print(f"{algorithm}: flow {time.monotonic() - t0:.0f} s; held-out {json.dumps(out['heldout'])}")
    for row in out["iterations"]:
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
    return out


def _assert_significant_gain(out: dict[str, Any]) -> None:
    h = out["heldout"]
    assert h["problems"] == 60 and h["before"]["samples"] == 240
    assert h["gain"] > 0 and h["gain_ci_low"] > 0 and h["p_value"] < 0.05, h


def test_grpo_raises_the_heldout_pass_rate_and_resumes_after_a_kill(rl_root: Path) -> None:
    store = rl_root / "store"
    proc = _codemill("rl", "--config", str(_config_file(rl_root, "grpo")), "--model", str(rl_root / "start" / "hf"))
    _kill_after_first_update(proc, store)
    assert list(store.glob("*/.staging-*")), "the kill came mid-iteration: its staging is the litter to sweep"

    out = _run(rl_root, "grpo")
    stages = out["stages"]
    done_before = ["problems", "warm-start", "heldout:before", "rollouts:0", "update:0"]
    assert {k: stages[k]["status"] for k in done_before} == dict.fromkeys(done_before, "present")
    assert all(stages[f"update:{i}"]["status"] == "ran" for i in range(1, ITERATIONS))
    _assert_significant_gain(out)

    st = ArtifactStore(str(store))
    found = committed_artifacts(st)  # every artifact whole; no staging left by the killed run
    assert list(store.glob("*/.staging-*")) == []
    train_ids = [p.problem_id for p in read_problem_set(st.local_path(st.ref("problems", "problems", stages[
        "problems"]["ref"]["digest"])) / "problems.parquet", "train")]
    drawn = [found[f"rollouts/it{i:03d}"].stats["problem_ids"] for i in range(ITERATIONS)]
    assert drawn == [iteration_problems(train_ids, 32, 0, i) for i in range(ITERATIONS)]
    epoch = [p for ids in drawn[:len(train_ids) // 32 + 1] for p in ids]
    assert len(epoch) == len(set(epoch))  # nothing repeated within an epoch, across the kill

    lineage = subprocess.run([str(CODEMILL), "lineage", out["model_id"], "--config", str(_config_file(rl_root, "grpo")),
                              "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert lineage.returncode == 0, lineage.stderr[-3000:]
    text = lineage.stdout
    for expected in ("rollouts:it003", "policy:grpo-it002", "rollouts:it000", "policy:warm-start", "problems:problems",
                     "weights outside the store", "synthetic"):
        assert expected in text, expected


def test_rejection_sampling_raises_the_heldout_pass_rate(rl_root: Path) -> None:
    out = _run(rl_root, "rft")
    assert out["stages"]["warm-start"]["status"] in ("present", "cached", "ran")
    assert all(out["stages"][f"update:{i}"]["summary"]["documents"] > 0 for i in range(ITERATIONS))
    _assert_significant_gain(out)


def test_a_malformed_problems_file_stops_the_run_naming_the_line(tmp_path: Path) -> None:
    from tests.tiny_policy import make_policy

    policy = make_policy(tmp_path / "start")
    bad = tmp_path / "problems.jsonl"
    good = {"task_id": "t/0", "prompt": "def f(x):\n", "entry_point": "f",
            "test": "def check(c):\n    assert c(1) == 1\n", "canonical_solution": "    return x\n"}
    bad.write_text(json.dumps(good) + '\n{"task_id": "t/1", "prompt": "def g(\n')
    cfg = rl_config(tmp_path, iterations=1)
    cfg.problems.sources[0] = cfg.problems.sources[0].model_copy(update={"kind": "jsonl", "path": str(bad)})
    path = tmp_path / "bad.yaml"
    path.write_text(cfg.model_dump_json())
    proc = _codemill("rl", "--config", str(path), "--model", str(policy))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-3000:]
    assert f"{bad}:2: not valid JSON" in out
    store = tmp_path / "store"
    assert not [p for p in store.glob("*/*") if not p.name.startswith(".")]  # nothing committed, nothing sampled
