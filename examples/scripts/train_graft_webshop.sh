#!/usr/bin/env bash
# GRAFT (arXiv 2609.28963) on WebShop, one node, its paper's protocol (Sec. 4.1: GiGPO's, 16 tasks x
# 8 rollouts, history 2, 15 steps, lr 1e-6, KL loss 0.01) and the graft_webshop preset (gamma 0.99, lambda 0.8).
# Override with environment variables (MODEL, GPUS_PER_NODE, TRAIN_ITERS, PRESET, ... see lib/train_args.sh)
# or extra train_ray flags:
#   bash examples/scripts/train_graft_webshop.sh --progpo.omega 2
set -euo pipefail
export ESTIMATOR=graft ENV_NAME=webshop PRESET=${PRESET:-graft_webshop}
# shellcheck source=examples/scripts/lib/one_node.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/one_node.sh"
progpo_one_node "$@"
