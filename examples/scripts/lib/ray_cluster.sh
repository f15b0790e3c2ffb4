# shellcheck shell=bash
# Ray cluster and service helpers shared by the launch scripts (sourced, not run).
#
# Every command that must run on a given node goes through the PROGPO_LAUNCH array: empty = run
# here (one node, tests), or e.g. PROGPO_LAUNCH=(srun --nodes=1 --ntasks=1 --overlap -w "$node")
# under SLURM. Waits poll with a timeout; nothing sleeps blindly.

if ! declare -p PROGPO_LAUNCH >/dev/null 2>&1; then
  PROGPO_LAUNCH=()
fi
RAY_HEAD_PID=""
RAY_WORKER_PIDS=()
WEBSHOP_PID=""

progpo_log() { printf '[progpo %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# progpo_free_port: print a TCP port that the OS reports free right now.
progpo_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1]); s.close()'
}

# progpo_ray_start_head NODE_IP GCS_PORT DASHBOARD_PORT TEMP_DIR [ray start args...]
# Starts a Ray head in the background (`ray start --head --block`, its own process group when run
# locally) and sets RAY_HEAD_PID. The dashboard listens on RAY_DASHBOARD_HOST (default 127.0.0.1:
# reach it through an SSH tunnel, see docs/distributed.md).
progpo_ray_start_head() {
  local ip=$1 port=$2 dash=$3 tmp=$4
  shift 4
  local cmd=(ray start --head --block --node-ip-address "$ip" --port "$port"
    --dashboard-host "${RAY_DASHBOARD_HOST:-127.0.0.1}" --dashboard-port "$dash"
    --temp-dir "$tmp" --disable-usage-stats "$@")
  progpo_log "starting Ray head on $ip:$port (dashboard port $dash)"
  if [ ${#PROGPO_LAUNCH[@]} -eq 0 ]; then
    setsid "${cmd[@]}" &
  else
    "${PROGPO_LAUNCH[@]}" "${cmd[@]}" &
  fi
  RAY_HEAD_PID=$!
}

# progpo_ray_start_worker GCS_ADDRESS [ray start args...]: join a worker node (background, --block;
# run here, it gets its own process group and its PID goes to RAY_WORKER_PIDS).
progpo_ray_start_worker() {
  local address=$1
  shift
  progpo_log "starting Ray worker joining $address"
  if [ ${#PROGPO_LAUNCH[@]} -eq 0 ]; then
    setsid ray start --address "$address" --block --disable-usage-stats "$@" &
    RAY_WORKER_PIDS+=("$!")
  else
    "${PROGPO_LAUNCH[@]}" ray start --address "$address" --block --disable-usage-stats "$@" &
  fi
}

# progpo_ray_stop_workers: stop the workers started here by progpo_ray_start_worker (only those).
progpo_ray_stop_workers() {
  local pid
  for pid in ${RAY_WORKER_PIDS[@]+"${RAY_WORKER_PIDS[@]}"}; do
    progpo_stop_pid "$pid" "${RAY_STOP_TIMEOUT:-90}"
  done
  RAY_WORKER_PIDS=()
}

# progpo_node_ip: this node's address as other nodes reach it (first of `hostname -I`).
progpo_node_ip() {
  local ip
  ip=$(hostname -I 2>/dev/null | awk '{print $1}')
  [ -n "$ip" ] || ip=$(hostname --ip-address 2>/dev/null | awk '{print $1}')
  echo "${ip:-127.0.0.1}"
}

# progpo_free_ports N: print N TCP ports that the OS reports free right now, one per line.
progpo_free_ports() {
  python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("", 0))
print("\n".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()' "$1"
}

# progpo_ray_alive_nodes GCS_ADDRESS: print the number of alive nodes (0 when unreachable).
progpo_ray_alive_nodes() {
  { ray status --address "$1" 2>/dev/null || true; } |
    awk '/^Active:/ {on = 1; next} /^(Pending|Recent failures):/ {on = 0} on && /node_/ {n++} END {print n + 0}'
}

# progpo_ray_wait_nodes GCS_ADDRESS N TIMEOUT_S: wait until N nodes are alive, else fail.
progpo_ray_wait_nodes() {
  local address=$1 want=$2 timeout=$3 start=$SECONDS have=0
  while [ $((SECONDS - start)) -lt "$timeout" ]; do
    have=$(progpo_ray_alive_nodes "$address")
    if [ "$have" -ge "$want" ]; then
      progpo_log "Ray cluster at $address has $have node(s)"
      return 0
    fi
    sleep 2
  done
  progpo_log "ERROR: only $have of $want Ray node(s) alive at $address after ${timeout}s"
  return 1
}

# progpo_ray_submit DASHBOARD_URL WORKING_DIR RUNTIME_ENV_JSON -- COMMAND...
# `ray job submit` (waits for the job and streams its logs; exit status = the job's).
progpo_ray_submit() {
  local url=$1 workdir=$2 env_json=$3
  if [ "${4:-}" != "--" ]; then
    progpo_log "ERROR: progpo_ray_submit needs -- before the job command"
    return 2
  fi
  shift 4
  progpo_log "submitting to $url: $*"
  ray job submit --address "$url" --working-dir "$workdir" --runtime-env-json "$env_json" -- "$@"
}

# progpo_stop_pid PID [TIMEOUT_S]: stop a process we started (its process group when it leads
# one, as `setsid` children do), SIGTERM first, SIGKILL after the timeout.
progpo_stop_pid() {
  local pid=$1 timeout=${2:-60} start=$SECONDS target
  [ -n "$pid" ] || return 0
  target=$pid
  if [ "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" = "$pid" ]; then
    target=-$pid
  fi
  kill -TERM -- "$target" 2>/dev/null || return 0
  while kill -0 -- "$target" 2>/dev/null; do
    if [ $((SECONDS - start)) -ge "$timeout" ]; then
      kill -KILL -- "$target" 2>/dev/null || true
      break
    fi
    sleep 1
  done
}

# progpo_ray_stop_head: stop the head started by progpo_ray_start_head (only that one; never
# `ray stop`, which kills every Ray process of the machine).
progpo_ray_stop_head() {
  progpo_stop_pid "$RAY_HEAD_PID" "${RAY_STOP_TIMEOUT:-90}"
  RAY_HEAD_PID=""
}

# progpo_wait_http URL TIMEOUT_S: poll URL until it answers HTTP 200, else fail.
progpo_wait_http() {
  local url=$1 timeout=$2 start=$SECONDS
  while [ $((SECONDS - start)) -lt "$timeout" ]; do
    if python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$url" 2>/dev/null; then
      return 0
    fi
    sleep 1
  done
  progpo_log "ERROR: $url did not answer within ${timeout}s"
  return 1
}

# progpo_start_server MODULE HOST PORT LOG [server args...]: start the env's HTTP server (its spec's
# `server`, `python3 -m MODULE --host HOST --port PORT ...`; WebShop's: envs.webshop_server, waitress) in
# the background from the repository root, set WEBSHOP_PID and WEBSHOP_URL, wait for /health.
progpo_start_server() {
  local module=$1 host=$2 port=$3 log=$4
  shift 4
  progpo_log "starting $module on $host:$port (log $log)"
  if [ ${#PROGPO_LAUNCH[@]} -eq 0 ]; then
    setsid python3 -m "$module" --host "$host" --port "$port" "$@" >"$log" 2>&1 &
  else
    "${PROGPO_LAUNCH[@]}" python3 -m "$module" --host "$host" --port "$port" "$@" >"$log" 2>&1 &
  fi
  WEBSHOP_PID=$!
  WEBSHOP_URL="http://$host:$port"
  export WEBSHOP_URL
  progpo_wait_http "$WEBSHOP_URL/health" "${WEBSHOP_START_TIMEOUT:-300}"
}

# progpo_stop_server: stop the server started by progpo_start_server.
progpo_stop_server() {
  progpo_stop_pid "$WEBSHOP_PID" 30
  WEBSHOP_PID=""
}
