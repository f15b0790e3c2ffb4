#!/usr/bin/env bash
# ProGPO on WebShop through the distributed path, on CPU only (`--rollout.backend hf`): a dry run of a
# cluster launch on a laptop. Starts the WebShop server here, then `python -m progpo.cli.train_ray`
# starts a local Ray head and runs OpenRLHF's own PPO trainer, policy (DeepSpeed ZeRO-3 over gloo)
# and reference actors, and a transformers generation engine behind OpenRLHF's engine interface,
# syncing the actor's weights into it after every update (checked: sync/max_abs_diff).
# CPU profile (lib/train_args.sh): SmolLM2-135M-Instruct, 2 tasks x 4 rollouts, 3 steps, 2 iterations.
#   bash examples/scripts/train_progpo_webshop_cpu.sh
#   MODEL=tiny TRAIN_ITERS=1 bash examples/scripts/train_progpo_webshop_cpu.sh --debug.dump_dir /tmp/dump
set -euo pipefail
export ESTIMATOR=${ESTIMATOR:-progpo} ENV_NAME=webshop DEVICE=cpu
export WEBSHOP_THREADS=${WEBSHOP_THREADS:-4}
# shellcheck source=examples/scripts/lib/one_node.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/one_node.sh"
progpo_one_node "$@"
