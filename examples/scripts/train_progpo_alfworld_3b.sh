#!/usr/bin/env bash
# ProGPO on ALFWorld, one node, Qwen2.5-3B-Instruct: the 1.5B protocol with a smaller micro-batch
# and more vLLM memory headroom (history 2, 50 steps, lr 1e-6, KL loss 0.01, ZeRO-3).
set -euo pipefail
export ESTIMATOR=${ESTIMATOR:-progpo} ENV_NAME=alfworld
export MODEL=${MODEL:-Qwen/Qwen2.5-3B-Instruct}
export MAX_TRAIN_MICRO_BATCH=${MAX_TRAIN_MICRO_BATCH:-4} MAX_ROLLOUT_MICRO_BATCH=${MAX_ROLLOUT_MICRO_BATCH:-8}
export VLLM_GPU_MEM=${VLLM_GPU_MEM:-0.45}
# shellcheck source=examples/scripts/lib/one_node.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/one_node.sh"
progpo_one_node "$@"
