# shellcheck shell=bash
# progpo_one_node [extra train_ray flags...]: train on this machine's GPUs (sourced by train_*.sh).
#
# Starts the env's server here (its spec's `server`: WebShop's) when WEBSHOP_URL is unset (stopped on exit),
# then runs `python -m progpo.cli.train_ray` as the Ray driver: it joins the cluster in RAY_ADDRESS
# or starts a local one (dashboard on 127.0.0.1:8265). The server listens on 127.0.0.1 for a local
# cluster, and on this node's address (progpo_node_ip; WEBSHOP_HOST overrides) when the job joins a
# cluster (RAY_ADDRESS set, or NUM_NODES > 1), whose engines on other nodes must reach it.
# PROGPO_DRY_RUN=1 prints the command instead, once train_ray's own checks passed on it (progpo_check_args).

PROGPO_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROGPO_REPO=${PROGPO_REPO:-$(cd "$PROGPO_SCRIPTS/../.." && pwd)}
# shellcheck source=examples/scripts/lib/ray_cluster.sh
source "$PROGPO_SCRIPTS/lib/ray_cluster.sh"
# shellcheck source=examples/scripts/lib/train_args.sh
source "$PROGPO_SCRIPTS/lib/train_args.sh"

progpo_one_node() {
  cd "$PROGPO_REPO" || return 1
  # every setting checked (one line naming it, status 2) before NUM_NODES is compared or a server starts, then
  # train_ray's own checks on the command line; the URL is a stand-in here (the server's real one is set when it
  # has started)
  WEBSHOP_URL=${WEBSHOP_URL:-http://127.0.0.1:0} progpo_train_args || return 2
  progpo_check_args "$@" || return 2
  local host=127.0.0.1
  if [ -n "${WEBSHOP_HOST:-}" ]; then
    host=$WEBSHOP_HOST
  elif [ -n "${RAY_ADDRESS:-}" ] || [ "${NUM_NODES:-1}" -gt 1 ]; then
    host=$(progpo_node_ip)
  fi
  local server
  server=$(progpo_env_fact server) || return 2
  if [ "${PROGPO_DRY_RUN:-0}" = 1 ]; then
    WEBSHOP_URL=${WEBSHOP_URL:-http://$host:${WEBSHOP_PORT:-3000}}
  elif [ -n "$server" ] && [ -z "${WEBSHOP_URL:-}" ]; then
    mkdir -p "${PROGPO_LOG_DIR:-logs}"
    trap progpo_stop_server EXIT
    progpo_start_server "$server" "$host" "${WEBSHOP_PORT:-$(progpo_free_port)}" "${PROGPO_LOG_DIR:-logs}/${ENV_NAME}_server.log" \
      ${WEBSHOP_DATA_DIR:+--data-dir "$WEBSHOP_DATA_DIR"} --threads "${WEBSHOP_THREADS:-32}"
  fi
  progpo_train_args
  local cmd=(python3 -m progpo.cli.train_ray "${PROGPO_ARGS[@]}" "$@")
  if [ "${PROGPO_DRY_RUN:-0}" = 1 ]; then
    printf '%s\n' "${cmd[@]}"
    return 0
  fi
  progpo_log "running: ${cmd[*]}"
  "${cmd[@]}"
}
