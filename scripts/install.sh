#!/usr/bin/env bash
# Every install step of the project, in one place: CI (.ci/run) and the local scripts
# (examples/scripts/run_local.sh, run_local_learning.sh) call this, so the two can never drift.
#
#   bash scripts/install.sh            # what the main job needs
#   bash scripts/install.sh --tests    # + Chromium and ChromeDriver for the browser tests (as CI)
#
# Each step runs only when a check finds something missing, so a second run installs nothing and
# takes about a second (scripts/requirements_missing.py compares installed versions with the pins):
#   1. Python packages: requirements.txt, then requirements-openrlhf-cpu.txt, then
#      requirements-nodeps.txt with --no-deps (each file installed whole when any line is unmet);
#   2. this project, editable (--no-deps -e .), when no `progpo` distribution is installed;
#   3. system packages (apt, as root): a C/C++ toolchain and cmake when alfworld has to be built
#      from source, and with --tests Chromium + ChromeDriver.
# PYTHON selects the interpreter (default python3; inside an activated venv, the venv's).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WITH_TESTS=0
for arg in "$@"; do
  case "$arg" in
    --tests) WITH_TESTS=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "scripts/install.sh: unknown argument $arg (expected --tests)" >&2; exit 2 ;;
  esac
done
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
  echo "scripts/install.sh: PYTHON=$PYTHON is not a Python >= 3.10 interpreter that runs here" >&2; exit 2
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
log() { printf '[install] %s\n' "$*" >&2; }

# apt_install PACKAGE...: install Debian packages (needs root; says what to run otherwise).
apt_install() {
  if [ "$(id -u)" != 0 ]; then
    log "ERROR: missing system packages: $*; install them (e.g. sudo apt-get install -y $*) and rerun"
    exit 1
  fi
  log "apt-get install $*"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@") >/dev/null
}

missing() { "$PYTHON" scripts/requirements_missing.py "$@"; }

t0=$SECONDS
need_main=$(missing requirements.txt)
need_cpu=$(missing requirements-openrlhf-cpu.txt)
need_nodeps=$(missing requirements-nodeps.txt)

# alfworld builds jericho and fast-downward from source: C/C++ toolchain + cmake
if printf '%s\n' "$need_main" | grep -q '^alfworld'; then
  if ! command -v g++ >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1 || ! command -v cmake >/dev/null 2>&1; then
    apt_install build-essential cmake
  fi
fi
if [ "$WITH_TESTS" = 1 ] && { ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; }; then
  apt_install chromium chromium-driver
fi

pip_install() {
  log "pip install $*"
  "$PYTHON" -m pip install --progress-bar off "$@"
}
if [ -n "$need_main" ]; then
  log "requirements.txt: $(printf '%s\n' "$need_main" | wc -l) line(s) unmet: $(printf '%s\n' "$need_main" | tr '\n' ' ' | cut -c1-300)"
  pip_install -r requirements.txt
fi
if [ -n "$need_cpu" ]; then
  log "requirements-openrlhf-cpu.txt: $(printf '%s\n' "$need_cpu" | wc -l) line(s) unmet"
  pip_install -r requirements-openrlhf-cpu.txt
fi
if [ -n "$need_nodeps" ]; then
  log "requirements-nodeps.txt: $(printf '%s\n' "$need_nodeps" | wc -l) line(s) unmet"
  pip_install --no-deps -r requirements-nodeps.txt
fi
if ! "$PYTHON" -c 'import importlib.metadata as m; m.version("progpo")' >/dev/null 2>&1; then
  pip_install --no-deps -e .
else
  # Installed already (maybe from another checkout): leave it. The scripts run from this checkout's
  # root and hand PYTHONPATH to their subprocesses and Ray workers, so this checkout's code is used.
  src=$("$PYTHON" -c 'import importlib.metadata as m, json; d = m.distribution("progpo").read_text("direct_url.json"); print(json.loads(d)["url"] if d else "")' 2>/dev/null || true)
  here="file://$PWD"
  if [ -n "$src" ] && [ "$src" != "$here" ]; then
    log "note: the progpo package is installed from ${src#file://}, not from here; this checkout's scripts import their own code"
  fi
fi
left=$(missing requirements.txt requirements-openrlhf-cpu.txt requirements-nodeps.txt)
if [ -n "$left" ]; then
  log "ERROR: still unmet after installing: $left"
  exit 1
fi
log "all requirements present ($((SECONDS - t0)) s)"
