#!/usr/bin/env bash
# One RL iteration on a GPU: vLLM sampling (weights synced from each update's export), the GRPO update under
# torchrun with FSDP2 over the GPUs, the sandbox judging on the CPUs; a fresh 125M policy unless POLICY names an
# HF folder. Prints the time split (generation, rewards, update, weight sync) with and without overlap, then
# the rollout engine against bare batched generation.
# Needs a CUDA machine with codemill installed (pip install -e '.[gpu]' with a CUDA build of torch) and vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -c "import vllm; print('vllm', vllm.__version__)"
GPUS=${GPUS:-1}
POLICY_ARGS=(--size 125m)
if [[ -n "${POLICY:-}" ]]; then POLICY_ARGS=(--policy "$POLICY"); fi
python -m benchmarks.rl "${POLICY_ARGS[@]}" --engine vllm --device cuda --parallelism fsdp --nproc "$GPUS" \
    --problems "${PROBLEMS:-128}" --k "${K:-8}" --max-new-tokens "${MAX_NEW_TOKENS:-128}" --repeats "${REPEATS:-2}" \
    --threads 1
