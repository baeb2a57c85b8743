#!/usr/bin/env bash
# GPU training throughput for a ~125M and a ~350M model (bf16 + torch.compile + FSDP2); prints tokens/s and MFU.
# Document masking is on (packed documents, FlexAttention with a block mask; each run prints the attention
# implementation that ran); NO_MASKING=1 measures plain causal attention instead.
# Needs a CUDA machine with codemill installed (pip install -e '.[gpu]' with a CUDA build of torch).
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
GPUS=${GPUS:-1}
MASKING=()
if [[ "${NO_MASKING:-0}" == 1 ]]; then MASKING=(--no-masking); fi
python -m benchmarks.gpu_train --size 125m --gpus "$GPUS" --micro-batch "${MB_125M:-16}" --steps "${STEPS:-60}" "${MASKING[@]}"
python -m benchmarks.gpu_train --size 350m --gpus "$GPUS" --micro-batch "${MB_350M:-8}" --steps "${STEPS:-60}" "${MASKING[@]}"
