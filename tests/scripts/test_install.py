"""scripts/install.sh and its check scripts/requirements_missing.py (the one install path of CI and the main job)."""

from __future__ import annotations

import importlib.metadata as md
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "requirements_missing.py"


def _missing(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    req = tmp_path / "req.txt"
    req.write_text(text)
    return subprocess.run([sys.executable, str(CHECK), str(req)], capture_output=True, text=True)


def test_check_lists_exactly_the_unmet_lines(tmp_path):
    numpy = md.version("numpy")
    res = _missing(tmp_path, f"""# a comment
numpy=={numpy}   # pinned to what is installed
numpy==0.0.1
surely-not-a-package-xyz==1.0
ray[default]=={md.version("ray")}
Numpy>=1.0
old-only; python_version < "3.0"
-r other.txt
""")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["numpy==0.0.1", "surely-not-a-package-xyz==1.0"]


def test_check_sees_a_missing_extra(tmp_path):
    # ray's "default" extra needs aiohttp etc. (installed); a made-up extra adds nothing, so it passes;
    # an extra of a package that is absent fails on the package itself
    res = _missing(tmp_path, "ray[no-such-extra]\nsurely-not-a-package-xyz[default]\n")
    assert res.stdout.splitlines() == ["surely-not-a-package-xyz[default]"]


def test_check_rejects_a_bad_line_and_a_missing_file(tmp_path):
    res = _missing(tmp_path, "not a requirement ===\n")
    assert res.returncode == 2 and "not a requirement line" in res.stderr
    res = subprocess.run([sys.executable, str(CHECK), str(tmp_path / "nope.txt")], capture_output=True, text=True)
    assert res.returncode == 2 and "nope.txt" in res.stderr


def test_project_requirements_are_all_met_here():
    files = ["requirements.txt", "requirements-openrlhf-cpu.txt", "requirements-nodeps.txt"]
    res = subprocess.run([sys.executable, str(CHECK), *files], cwd=REPO, capture_output=True, text=True, check=True)
    assert res.stdout == ""


def test_second_install_run_calls_no_pip(tmp_path):
    """Everything is installed here, so install.sh must not start pip (or apt) at all."""
    log = tmp_path / "calls.log"
    shim = tmp_path / "python"
    shim.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    res = subprocess.run(["bash", "scripts/install.sh"], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHON=str(shim)))
    assert res.returncode == 0, res.stderr
    assert "all requirements present" in res.stderr
    calls = log.read_text().splitlines()
    assert calls and not any(c.startswith("-m pip") for c in calls), calls


def test_install_rejects_unknown_arguments():
    res = subprocess.run(["bash", "scripts/install.sh", "--gpu"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 2 and "unknown argument --gpu" in res.stderr


@pytest.mark.parametrize("env, quoted", [
    ("atari", "'atari'"), (" ", "' '"), ("alfworld ", "'alfworld '"), ("wébshop", "'wébshop'"),
    ("web\nshop", "$'web\\nshop'"), ("webshop;touch x", "'webshop;touch x'"),
    # a name that begins with "-" was read by the envs CLI as its option: -h printed its usage as the step limit
    ("-h", "'-h'"), ("--help", "'--help'"), ("--max_steps", "'--max_steps'"), ("-", "'-'"),
])
def test_main_job_script_rejects_a_bad_env_before_installing(env, quoted):
    """One line naming ENV (quoted as bash's ${ENV@Q}: a space or newline stays visible, on one line)."""
    res = subprocess.run(["bash", "examples/scripts/run_local.sh"], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, ENV=env, PROGPO_DRY_RUN="1"))
    (line,) = res.stderr.splitlines()
    assert res.returncode == 2 and res.stdout == "" and line.startswith(f"run_local.sh: ENV={quoted}: "), line
    assert "unknown env " in line and "registered:" in line and "webshop" in line
    assert "[install]" not in res.stderr


def test_install_names_a_python_that_does_not_run(tmp_path):
    res = subprocess.run(["bash", "scripts/install.sh"], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHON=str(tmp_path / "nope" / "python")))
    assert res.returncode == 2, res.stderr
    assert f"PYTHON={tmp_path / 'nope' / 'python'} is not a Python >= 3.10 interpreter" in res.stderr


@pytest.mark.parametrize("name, value, says", [
    ("RL_ITERS", "-1", "RL_ITERS must be an integer >= 1, got '-1'"),
    ("SFT_TASKS", "abc", "SFT_TASKS must be an integer >= 1, got 'abc'"),
    ("MAX_STEPS", "1.5", "MAX_STEPS must be an integer >= 1, got '1.5'"),
    ("HISTORY_LENGTH", "-1", "HISTORY_LENGTH must be an integer >= 0, got '-1'"),
    ("SFT_LR", "-1e-5", "SFT_LR must be a number > 0, got '-1e-5'"),
    ("RL_LR", "0.0", "RL_LR must be a number > 0, got '0.0'"),
    ("RL_ROLLOUTS", "1", "RL_ROLLOUTS must be an integer >= 2, got '1'"),
    ("RL_OFFSET", "-3", "RL_OFFSET must be an integer >= 0, got '-3'"),
    ("RL_TRAIN_BATCH", "0", "RL_TRAIN_BATCH must be an integer >= 1, got '0'"),
    ("RL_SEED", "seven", "RL_SEED must be an integer >= 0, got 'seven'"),
    ("DYNAMIC_SAMPLING", "yes", "DYNAMIC_SAMPLING must be true or false, got 'yes'"),
    ("OUT", "{file}", "OUT must be a folder, got the file '{file}'"),
])
def test_learning_script_rejects_a_bad_setting_before_installing(tmp_path, name, value, says):
    """Each was taken and failed only at its step (SFT_TASKS after the base evaluation, RL_ITERS
    after SFT: up to an hour in), or ran with a nonsense value."""
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    env = {**os.environ, "PRETRAIN": "tiny", "OUT": str(tmp_path / "out"), name: value.replace("{file}", str(blocker))}
    # its own session: were the check missing, the script's steps are stopped with it, not orphaned
    proc = subprocess.Popen(["bash", "examples/scripts/run_local_learning.sh"], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 2, err[-500:]
    assert f"run_local_learning.sh: {says.replace('{file}', str(blocker))}" in err
    assert "[install]" not in err and not (tmp_path / "out").exists()
    assert blocker.read_text() == "keep me"


def _pins(path: Path) -> dict[str, str]:
    """``name -> version`` of the ``name==version`` lines of a requirements file (extras dropped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.split("[")[0].strip().lower()] = version.strip()
    return out


def test_gpu_requirements_pin_what_openrlhf_pins_and_the_docs_say_what_they_need():
    """requirements-gpu.txt: the GPU stack OpenRLHF 0.11.2's own metadata pins (its vllm extra included),
    and the needs its header states (CUDA 13, driver >= 580, Python 3.10-3.12, flash-attn from source)
    repeated in docs/distributed.md's install section, with every pinned version."""
    pins = _pins(REPO / "requirements-gpu.txt")
    theirs = {}
    for req in md.requires("openrlhf"):
        spec, _, marker = req.partition(";")
        if "==" in spec and (not marker or 'extra == "vllm"' in marker):
            name, version = spec.split("==")
            theirs[name.split("[")[0].strip().lower()] = version.strip()
    assert pins["openrlhf"] == md.version("openrlhf")
    for name in ("deepspeed", "ray", "transformers", "vllm"):
        assert pins[name] == theirs[name], name
    header = (REPO / "requirements-gpu.txt").read_text()
    assert f"flash-attn=={theirs['flash-attn']}" in header
    docs = (REPO / "docs" / "distributed.md").read_text()
    install = docs[docs.index("## Install"):docs.index("## Run")]
    for name, version in {**pins, "flash-attn": theirs["flash-attn"]}.items():
        if name in ("torch", "vllm", "openrlhf", "deepspeed", "ray", "transformers", "flash-attn"):
            assert f"{name}" in install and version in install, (name, version)
    for need in ("CUDA 13", ">= 580", "3.10", "3.12", "from source"):
        assert need in header and need in install, need
