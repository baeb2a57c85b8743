"""The vLLM side of tests/integration/test_vllm.py, run under the vLLM environment's python:
``python vllm_checks.py args.json out.json``. Three engine starts (each ~20-60 s on CPU): float32 on the policy
(greedy, sampled log-probs, the weight sync and the prefix cache), float32 fresh on the updated weights, bfloat16
on ``bf16_policy`` (default: the policy; sampled log-probs)."""

from __future__ import annotations

import gc
import json
import sys
import time
from typing import Any

from codemill.models.engines import RolloutParams, VLLMEngine


def run(engine: VLLMEngine, prompts: list[str], k: int, params: RolloutParams, seeds: list[int]) -> list[Any]:
    return [[{"prompt_ids": c.prompt_ids, "ids": c.completion_ids, "logprobs": c.logprobs, "text": c.text,
              "reason": c.finish_reason} for c in group]
            for group in engine.generate(prompts, k, params, seeds)]


def cached_tokens(engine: VLLMEngine, prompts: list[str]) -> list[int]:
    """Each prompt's tokens that vLLM found in its prefix cache (``RequestOutput.num_cached_tokens``), one greedy
    token per prompt."""
    sp = engine._vllm.SamplingParams(temperature=0.0, max_tokens=1)
    outputs = engine.llm.generate([{"prompt_token_ids": engine.encode(p, 1)} for p in prompts], sampling_params=sp,
                                  use_tqdm=False)
    return [int(o.num_cached_tokens or 0) for o in outputs]


def main(args: dict[str, Any]) -> dict[str, Any]:
    prompts, long_prompts, seeds = args["prompts"], args["long_prompts"], args["seeds"]
    k, new = args["k"], args["max_new_tokens"]
    greedy = RolloutParams(temperature=0.0, max_new_tokens=new)
    sampled = RolloutParams(temperature=args["temperature"], max_new_tokens=new)
    opts = {"enforce_eager": True, "max_context": 512}
    out: dict[str, Any] = {}

    t0 = time.monotonic()
    e = VLLMEngine(args["policy"], dtype="float32", **opts)
    out["start_s"] = time.monotonic() - t0
    out["greedy"] = run(e, prompts, 1, greedy, seeds)
    out["sampled_f32"] = run(e, prompts, k, sampled, seeds)
    long_seeds = seeds[:len(long_prompts)]
    out["long_before"] = run(e, long_prompts, 1, greedy, long_seeds)  # their prompt blocks are now cached
    out["long_again"] = run(e, long_prompts, 1, greedy, long_seeds)
    out["prompt_tokens"] = [len(e.encode(p, 1)) for p in long_prompts]
    out["cached_tokens"] = cached_tokens(e, long_prompts)
    # New weights without the cache reset: the cached prompt blocks still hold the old weights' keys and values.
    out["rpc_counts"] = e.llm.collective_rpc("codemill_load_weights", args=(args["updated"],))
    out["long_stale"] = run(e, long_prompts, 1, greedy, long_seeds)
    out["reset"] = e.llm.reset_prefix_cache()
    out["cached_tokens_after_reset"] = cached_tokens(e, long_prompts)
    out["long_reset"] = run(e, long_prompts, 1, greedy, long_seeds)
    # The engine's own path (weights + reset), there and back.
    e.load_weights(args["policy"])
    out["long_back"] = run(e, long_prompts, 1, greedy, long_seeds)
    t0 = time.monotonic()
    e.load_weights(args["updated"])
    out["load_weights_s"] = time.monotonic() - t0
    out["loaded_long"] = run(e, long_prompts, 1, greedy, long_seeds)
    out["loaded_greedy"] = run(e, prompts, 1, greedy, seeds)
    out["loaded_sampled"] = run(e, prompts, k, sampled, seeds)
    del e
    gc.collect()

    fresh = VLLMEngine(args["updated"], dtype="float32", **opts)
    out["fresh_long"] = run(fresh, long_prompts, 1, greedy, long_seeds)
    out["fresh_greedy"] = run(fresh, prompts, 1, greedy, seeds)
    out["fresh_sampled"] = run(fresh, prompts, k, sampled, seeds)
    del fresh
    gc.collect()

    bf16 = VLLMEngine(args.get("bf16_policy", args["policy"]), dtype="bfloat16", **opts)
    out["sampled_bf16"] = run(bf16, prompts, k, sampled, seeds)
    out["greedy_bf16"] = run(bf16, prompts, 1, greedy, seeds)
    return out


if __name__ == "__main__":  # vLLM spawns its workers: the engine must start under this guard
    args_file, out_file = sys.argv[1:3]
    with open(args_file) as fh:
        result = main(json.load(fh))
    with open(out_file, "w") as fh:
        json.dump(result, fh)
