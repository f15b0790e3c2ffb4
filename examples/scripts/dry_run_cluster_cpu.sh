#!/usr/bin/env bash
# The cluster launch, shaped like the GPU cluster, on one CPU machine (no GPU needed):
#   * two Ray nodes: a head and a second raylet joining it (`ray start --address`, as on a second
#     host), each declaring GPU_SLOTS logical GPUs, so that OpenRLHF's own placement groups, GPU
#     bundles and colocation fractions land on them as on 2 nodes x GPU_SLOTS GPUs;
#   * ProGPO on ALFWorld through `python -m progpo.cli.train_ray --rollout.backend hf`, with the GPU scripts'
#     placement and colocation flags (--train.colocate_all --vllm.enable_sleep; DeepSpeed's sleep mode
#     has no CPU path): 2 x GPU_SLOTS policy ranks and as many reference ranks under ZeRO-3 over gloo,
#     as many CPU engines, each building its ALFWorld env actors inside itself;
#   * the GPU scripts' batch arithmetic scaled to these ranks (lib/train_args.sh): 2 tasks x 4
#     rollouts, rollout micro batch = episodes / ranks, train batch = 2 x episodes, the same gradient
#     accumulation (4) as 16 x 8 on 8 GPUs; step counts vary per iteration (up to 3 steps).
# The two nodes are stopped at the end (only ours: never `ray stop`). Any train_ray flag may follow.
#   bash examples/scripts/dry_run_cluster_cpu.sh                          # SmolLM2-135M, 2 iterations
#   MODEL=tiny bash examples/scripts/dry_run_cluster_cpu.sh --debug.dump_dir /tmp/dump
# ASYNC=1 runs OpenRLHF's async mode in the same shape: each node then declares 2 GPU slots (GPU_SLOTS's default
# becomes 2), one for its policy + reference ranks, one for its engine (lib/train_args.sh "ASYNC").
#   ASYNC=1 bash examples/scripts/dry_run_cluster_cpu.sh
# Environment: MODEL, TRAIN_ITERS, GPU_SLOTS (1; 2 with ASYNC=1), NODE_CPUS (3), ENV_ACTORS_PER_ENGINE (2),
# RAY_TMPDIR, and every variable of lib/train_args.sh.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
# shellcheck source=examples/scripts/lib/ray_cluster.sh
source "$REPO/examples/scripts/lib/ray_cluster.sh"
# shellcheck source=examples/scripts/lib/train_args.sh
source "$REPO/examples/scripts/lib/train_args.sh"

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # every Ray worker imports this checkout
# Ray 2.60's token auth for the nodes, `ray status` and the driver alike (the token in ~/.ray/auth_token,
# created by the head if missing); RAY_AUTH_MODE=disabled turns it off (see "Auth note" in docs/distributed.md)
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
SLOTS=${GPU_SLOTS:-$([ "${ASYNC:-0}" = 1 ] && echo 2 || echo 1)}
CPUS=${NODE_CPUS:-3}
IP=$(progpo_node_ip)
RAY_TMP=${RAY_TMPDIR:-/tmp/progpo_dry_$$}  # short: Ray's socket paths must stay < 108 characters

cleanup() {
  progpo_ray_stop_workers
  progpo_ray_stop_head
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # a stopped run stops its nodes too

node_args() {  # explicit free ports (other Ray clusters may run on this machine), resources, small object store
  local p
  mapfile -t p < <(progpo_free_ports 6)
  echo --node-manager-port "${p[0]}" --object-manager-port "${p[1]}" --dashboard-agent-listen-port "${p[2]}" \
    --dashboard-agent-grpc-port "${p[3]}" --runtime-env-agent-port "${p[4]}" --metrics-export-port "${p[5]}" \
    --num-cpus "$CPUS" --num-gpus "$SLOTS" --object-store-memory 300000000
}
export ESTIMATOR=${ESTIMATOR:-progpo} ENV_NAME=alfworld DEVICE=cpu COLOCATE=1
export NUM_NODES=2 GPUS_PER_NODE=$SLOTS ENV_ACTORS_PER_ENGINE=${ENV_ACTORS_PER_ENGINE:-2}
export RUN_NAME=${RUN_NAME:-dry_run_cluster_cpu}
progpo_train_args || exit 2
progpo_check_args "$@" || exit 2  # train_ray's own checks, before the nodes start

mapfile -t PORTS < <(progpo_free_ports 3)
# shellcheck disable=SC2046
progpo_ray_start_head "$IP" "${PORTS[0]}" "${PORTS[1]}" "$RAY_TMP" --include-dashboard false \
  --ray-client-server-port "${PORTS[2]}" $(node_args)
progpo_ray_wait_nodes "$IP:${PORTS[0]}" 1 "${RAY_START_TIMEOUT:-300}"
# shellcheck disable=SC2046
progpo_ray_start_worker "$IP:${PORTS[0]}" $(node_args)
progpo_ray_wait_nodes "$IP:${PORTS[0]}" 2 "${RAY_START_TIMEOUT:-300}"

export RAY_ADDRESS="$IP:${PORTS[0]}"
progpo_log "running: python3 -m progpo.cli.train_ray ${PROGPO_ARGS[*]} $*"
python3 -m progpo.cli.train_ray "${PROGPO_ARGS[@]}" "$@"
