#!/usr/bin/env bash
# CRBC (arXiv 2609.35082) on WebShop, one node, its paper's protocol (App. C.3, Table 5): GiGPO's
# (16 tasks x 8 rollouts, 15 steps, lr 1e-6, KL loss 0.01) with 5120 prompt tokens for 150 updates, and the
# crbc preset (beta 0.98, w_G 1, w_S 5, sigma_min 0.1).
# Override with environment variables (MODEL, GPUS_PER_NODE, TRAIN_ITERS, PRESET, ... see lib/train_args.sh)
# or extra train_ray flags:
#   bash examples/scripts/train_crbc_webshop.sh --progpo.omega 2
set -euo pipefail
export ESTIMATOR=crbc ENV_NAME=webshop PRESET=${PRESET:-crbc} TRAIN_ITERS=${TRAIN_ITERS:-150}
export MAX_PROMPT_TOKENS=${MAX_PROMPT_TOKENS:-5120} MAX_LEN=${MAX_LEN:-5632}
# shellcheck source=examples/scripts/lib/one_node.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/one_node.sh"
progpo_one_node "$@"
