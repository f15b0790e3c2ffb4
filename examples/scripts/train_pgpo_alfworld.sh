#!/usr/bin/env bash
# PGPO (arXiv 2609.02236) on ALFWorld, one node, its paper's protocol (App. B.3): GiGPO's (16 tasks x
# 8 rollouts, history 2, 50 steps, lr 1e-6, KL loss 0.01, 160 iterations) with 4096 prompt tokens, and the
# pgpo preset (eta 0.95, alpha 2, beta 1, gamma 1).
# Override with environment variables (MODEL, GPUS_PER_NODE, TRAIN_ITERS, PRESET, ... see lib/train_args.sh)
# or extra train_ray flags:
#   bash examples/scripts/train_pgpo_alfworld.sh --progpo.omega 2
set -euo pipefail
export ESTIMATOR=pgpo ENV_NAME=alfworld PRESET=${PRESET:-pgpo}
export MAX_PROMPT_TOKENS=${MAX_PROMPT_TOKENS:-4096} MAX_LEN=${MAX_LEN:-4608}
# shellcheck source=examples/scripts/lib/one_node.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/one_node.sh"
progpo_one_node "$@"
