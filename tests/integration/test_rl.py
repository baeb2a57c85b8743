"""RL for code end to end: the ``rl`` flow on the synthetic problems (split by instance), from a tiny base model
that learned from scraped code, where a share of the functions are stubs (``pass`` / ``raise
NotImplementedError``). GRPO and rejection sampling both raise the pass rate on held-out problems, significantly
under the paired per-problem statistics: the reward teaches the policy that stubs fail, on problems it never
sampled. A GRPO flow SIGKILLed in its second iteration resumes at the first missing artifact with no rollout
skipped or repeated, and ``codemill lineage`` walks its checkpoint back to the rollouts, the sampling policy, the
problems and their source.

What these runs do not show: RL teaching a skill the base model lacks. Started from a model trained on the
references alone (no stubs), the same GRPO runs changed the held-out rate by -0.02 to +0.07, not significantly:
that model's failures are constants it does not copy from the prompt, and rewarding one problem's constant does
not teach copying (README "RL for code")."""

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

from codemill.problems.sets import read_problem_set
from codemill.rl.data import iteration_problems
from codemill.store import ArtifactStore
from tests.integration.rl_setup import make_base_policy, rl_config
from tests.integration.store_checks import committed_artifacts

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]
ROOT = Path(__file__).resolve().parents[2]
CODEMILL = Path(sys.executable).parent / "codemill"
ITERATIONS = 4
PER_ITERATION = 64
# Tuned on this family (README "RL for code"): GRPO after a brief warm start on a quarter of the train references,
# as Dr. GRPO (no std normalisation), 128 samples per optimizer step, two passes over each iteration's samples,
# AdamW carried across iterations; rejection sampling straight from the base model (after the warm start few stubs
# are left, and learning from passing samples only, it then moved the held-out rate by +0.02), two epochs over
# each iteration's distinct passing samples.
SETTINGS: dict[str, Any] = {
    "iterations": ITERATIONS, "heldout_samples": 16, "warm_start_share": 0.25,
    "warm_start": {"max_steps": 20, "lr": 3e-4, "micro_batch_size": 16, "seq_len": 128},
    "rollout": {"problems_per_iteration": PER_ITERATION, "samples_per_problem": 8, "max_new_tokens": 32,
                "workers": 2},
}
ALGORITHMS: dict[str, dict[str, Any]] = {
    "grpo": {"name": "grpo", "lr": 1e-4, "micro_batch_size": 16, "grad_accum": 4, "epochs": 2,
             "norm_adv_by_std": False, "device": "cpu"},
    "rft": {"name": "rft", "max_steps": 50, "epochs": 2.0, "lr": 2e-4, "warmup_steps": 2, "micro_batch_size": 8,
            "seq_len": 128},
}
PER_ALGORITHM: dict[str, dict[str, Any]] = {"grpo": {}, "rft": {"warm_start": {"max_steps": 0}}}


@pytest.fixture(scope="module")
def rl_root(tmp_path_factory, prefect_harness) -> Path:
    """One store for both algorithms: they share the problems and the base model, pretrained on the train split's
    scraped code (``rl_setup.scraped_code``): the problems stage runs first, and the flows find it in the store."""
    from codemill.flows.problems import problems

    root = tmp_path_factory.mktemp("rl")
    ref = problems(config=rl_config(root))["stages"]["problems"]["ref"]
    st = ArtifactStore(str(root / "store"))
    train = read_problem_set(st.local_path(st.ref("problems", ref["name"], ref["digest"])) / "problems.parquet",
                             "train")
    make_base_policy(root / "start", train)
    return root


def _config_file(root: Path, algorithm: str) -> Path:
    cfg = rl_config(root, **{**SETTINGS, **PER_ALGORITHM[algorithm], "algorithm": ALGORITHMS[algorithm]})
    path = root / f"{algorithm}.yaml"
    path.write_text(cfg.model_dump_json())
    return path


def _codemill(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return subprocess.Popen([str(CODEMILL), *args], cwd=ROOT, env={**env, "PREFECT_API_URL": PREFECT_API_URL.value()},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _kill_in_the_second_iteration(proc: subprocess.Popen, store: Path, timeout: float = 900) -> None:
    """SIGKILL the whole run while iteration 1's rollouts are being written (iteration 0 is committed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(store.glob("rollouts/.staging-it001-*")):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read()[-4000:] if proc.stdout else "the run ended")
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise TimeoutError("iteration 1 never started")


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


def _assert_heldout_comparison(out: dict[str, Any]) -> None:
    """Both policies sampled every held-out problem 16 times; the reported gain is after - before, inside its CI,
    and significant."""
    h = out["heldout"]
    assert h["problems"] == 60 and h["before"]["samples"] == h["after"]["samples"] == 60 * 16
    assert h["gain"] == pytest.approx(h["after"]["rate"] - h["before"]["rate"])
    assert h["gain_ci_low"] <= h["gain"] <= h["gain_ci_high"] and 0 <= h["p_value"] <= 1
    assert 0 < h["before"]["rate"] < 1  # the warm start solves some held-out problems, not all
    assert h["gain"] > 0 and h["gain_ci_low"] > 0 and h["p_value"] < 0.05, h  # it learnt, beyond the noise


def test_grpo_flow_resumes_after_a_kill_and_traces_its_checkpoint(rl_root: Path) -> None:
    store = rl_root / "store"
    proc = _codemill("rl", "--config", str(_config_file(rl_root, "grpo")), "--model", str(rl_root / "start" / "hf"))
    _kill_in_the_second_iteration(proc, store)
    assert list(store.glob("policy/grpo-it000-*/manifest.json"))
    assert list(store.glob("rollouts/.staging-it001-*")), "the killed iteration's staging: litter to sweep"

    out = _run(rl_root, "grpo")
    stages = out["stages"]
    done_before = ["problems", "warm-start", "heldout:before", "rollouts:0", "update:0"]
    assert all(stages[k]["status"] in ("present", "cached") for k in done_before), stages  # found, not redone
    assert all(stages[f"update:{i}"]["status"] == "ran" for i in range(1, ITERATIONS))
    _assert_heldout_comparison(out)

    st = ArtifactStore(str(store))
    found = committed_artifacts(st)  # every artifact whole; no staging left by the killed run
    assert list(store.glob("*/.staging-*")) == []
    train_ids = [p.problem_id for p in read_problem_set(st.local_path(st.ref("problems", "problems", stages[
        "problems"]["ref"]["digest"])) / "problems.parquet", "train")]
    drawn = [found[f"rollouts/it{i:03d}"].stats["problem_ids"] for i in range(ITERATIONS)]
    assert drawn == [iteration_problems(train_ids, PER_ITERATION, 0, i) for i in range(ITERATIONS)]
    epoch = [p for ids in drawn[:-(-len(train_ids) // PER_ITERATION)] for p in ids]
    assert sorted(epoch) == sorted(train_ids)  # the first epoch: every problem once, across the kill

    lineage = subprocess.run([str(CODEMILL), "lineage", out["model_id"], "--config", str(_config_file(rl_root, "grpo")),
                              "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert lineage.returncode == 0, lineage.stderr[-3000:]
    text = lineage.stdout
    for expected in ("rollouts:it003", "policy:grpo-it002", "rollouts:it000", "policy:warm-start", "problems:problems",
                     "weights outside the store", "synthetic seed=0 count=300"):
        assert expected in text, expected


def test_rejection_sampling_fine_tunes_on_the_passing_samples(rl_root: Path) -> None:
    from transformers import AutoTokenizer

    from codemill.rl.data import passing_documents
    from codemill.rl.trajectory import read_rollouts

    out = _run(rl_root, "rft")
    stages, st = out["stages"], ArtifactStore(str(rl_root / "store"))
    eos = {AutoTokenizer.from_pretrained(str(rl_root / "start" / "hf")).eos_token_id}
    for i in range(ITERATIONS):
        ref = stages[f"rollouts:{i}"]["ref"]
        rows = read_rollouts(st.local_path(st.ref("rollouts", ref["name"], ref["digest"])) / "rollouts.parquet")
        passing = passing_documents(rows.to_pylist(), eos)
        update = stages[f"update:{i}"]["summary"]
        assert update["algorithm"] == "rft" and update["documents"] == len(passing) > 0
        assert 1 <= update["steps"] <= ALGORITHMS["rft"]["max_steps"] and not update["unchanged"]
    _assert_heldout_comparison(out)


def test_grpo_runs_on_the_multi_turn_feedback_environment(rl_root: Path) -> None:
    """GRPO end to end on ``code_feedback``: episodes of up to 3 turns whose feedback tokens are in the rollouts
    under loss mask 0, updates that train on the sampled tokens, and the same lineage as single-turn RL."""
    from codemill.config import PipelineConfig
    from codemill.flows.rl import rl
    from codemill.rl.trajectory import read_rollouts

    settings = {**SETTINGS, "algorithm": ALGORITHMS["grpo"], "iterations": 2, "heldout_samples": 2,
                "warm_start": {"max_steps": 0},
                "env": {"kind": "code_feedback", "max_turns": 3, "visible_cases": 2},
                "rollout": {**SETTINGS["rollout"], "problems_per_iteration": 16, "samples_per_problem": 4}}
    cfg = rl_config(rl_root, **settings)
    path = rl_root / "feedback.yaml"
    path.write_text(cfg.model_dump_json())
    out = rl(config=PipelineConfig.model_validate_json(path.read_text()), model=str(rl_root / "start" / "hf"))
    for row in out["iterations"]:
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
    stages, st = out["stages"], ArtifactStore(str(rl_root / "store"))
    for i, row in enumerate(out["iterations"]):
        assert 1 < row["turns_mean"] <= 3 and 0 < row["observed_token_frac"] < 1, row
        ref = stages[f"rollouts:{i}"]["ref"]
        rows = read_rollouts(st.local_path(st.ref("rollouts", ref["name"], ref["digest"])) / "rollouts.parquet")
        table = rows.to_pylist()
        multi = [r for r in table if r["turns"] > 1]
        assert multi and all(0 in r["loss_mask"] for r in multi)
        assert all(r["turns"] == 1 or r["turn_rewards"][0] == 0.0 for r in table)  # a revised episode failed first
        update = stages[f"update:{i}"]["summary"]
        assert update["algorithm"] == "grpo" and update["update"]["steps"] > 0, update
        assert update["update"]["tokens"] > 0
    lineage = subprocess.run([str(CODEMILL), "lineage", out["model_id"], "--config", str(path), "--json"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert lineage.returncode == 0, lineage.stderr[-3000:]
    for expected in ("rollouts:it001", "policy:grpo-it000", "rollouts:it000", "problems:problems",
                     "synthetic seed=0 count=300"):
        assert expected in lineage.stdout, expected


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
