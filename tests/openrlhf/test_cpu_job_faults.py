"""A dying worker costs its episodes, not the run: the CPU jobs of ``test_cpu_job.py`` with a fault
injected while they run (from outside, as a crash or an operator would).

* ``dry_run_cluster_cpu.sh`` (2 Ray nodes, 2 engines each hosting 2 ALFWorld env actors): one env actor
  is killed with ``ray.kill`` while it hosts an episode in iteration 1. That episode fails with its kind
  counted (``rollout/failed/env_actor_died``), the pool starts a replacement, iteration 2 runs all 8
  episodes on 4 live env actors, and the job ends with exit 0 (below ``--env.max_failed_frac``).
* ``train_progpo_webshop_cpu.sh`` against a WebShop server this test owns: the server is stopped and
  started again while episodes run. Episodes whose sessions it lost fail as ``env_session_lost``; the
  next iteration has no failure; exit 0.
* the same script with its engine (the CPU stand-in of OpenRLHF's vLLM engine actor) killed (SIGKILL,
  as the kernel's OOM killer would) in the middle of the rollout: OpenRLHF does not restart engines and
  each engine is a member of the weight-sync group, so the run cannot go on; it stops with exit 4 and
  one last line naming the engine, within the test's patience (no hang).

Cost on a 2-core machine: the cluster job ~8 minutes, each one-node job 1-2 minutes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from progpo.run.failures import EXIT_ENGINE_DIED
from progpo.testing import PATIENCE_S, wait_until

from .test_cpu_job import (  # noqa: F401 - start_model is a fixture
    CLUSTER_SCRIPT,
    _free_port,
    dumped_iterations,
    real,
    run_cpu_job,
    start_model,
    tensorboard_scalars,
)

pytestmark = pytest.mark.slow

FAULTS = Path(__file__).with_name("fault_injection.py")
PROG = "python -m progpo.cli.train_ray"


def _sessions(url: str) -> int:
    """Live sessions of the WebShop server at ``url`` (0 while it does not answer)."""
    try:
        return int(requests.get(f"{url}/health", timeout=10).json()["sessions"])
    except requests.RequestException:
        return 0


def _engine_pids(ray_tmp: str) -> list[int]:
    """Process ids of this job's CPU engine actors (``ray::CPURolloutActor`` under the job's RAY_TMPDIR)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if title.startswith("ray::CPURolloutActor") and f"RAY_TMPDIR={ray_tmp}".encode() in environ:
            pids.append(int(proc.name))
    return pids


def test_killed_engine_stops_the_run_with_a_line_naming_it(tmp_path, shared_data, start_model):  # noqa: F811
    def kill_engine(live: dict) -> int:
        url = f"http://127.0.0.1:{live['webshop_port']}"
        wait_until(lambda: _sessions(url) > 0, "episodes running on the WebShop server", PATIENCE_S)
        (pid,) = wait_until(lambda: _engine_pids(live["ray_tmp"]), "the job's engine process", PATIENCE_S)
        os.kill(pid, signal.SIGKILL)
        return pid

    job = run_cpu_job(tmp_path, shared_data, start_model, estimator="progpo", iters=1,
                      extra=["--algo.kl.init_coef", "0"], timeout_s=2 * PATIENCE_S, during=kill_engine)
    assert job["rc"] == EXIT_ENGINE_DIED, job["log"][-6000:]
    last = job["stderr"].rstrip().splitlines()[-1]
    assert last.startswith(f"{PROG}: error: vLLM engine 0 of 1 "), last
    assert "died" in last and "cannot go on" in last
    assert not (job["out"] / "final").exists()  # nothing saved
    assert job["ray_tmp"] not in job["leftover"]


def test_webshop_server_restart_costs_its_episodes_not_the_run(tmp_path, shared_data, start_model):  # noqa: F811
    from envs.webshop_server.process import WebShopServerProcess

    port = _free_port()
    server = WebShopServerProcess(shared_data / "webshop", port=port, threads=4)
    server.start()
    restarted: list[WebShopServerProcess] = []

    def restart(live: dict) -> int:
        in_flight = wait_until(lambda: _sessions(server.url), "episodes running on the WebShop server", PATIENCE_S)
        server.stop()
        again = WebShopServerProcess(shared_data / "webshop", port=port, threads=4)
        restarted.append(again)
        again.start()
        return in_flight

    try:
        # 2 sessions at a time: a restart loses the in-flight ones, not the whole batch
        job = run_cpu_job(tmp_path, shared_data, start_model, estimator="progpo", iters=2,
                          extra=["--algo.kl.init_coef", "0", "--env.num_envs", "2"], timeout_s=3 * PATIENCE_S,
                          during=restart, WEBSHOP_URL=server.url)
    finally:
        server.stop()
        for s in restarted:
            s.stop()
    assert job["rc"] == 0, job["log"][-6000:]
    tb = tensorboard_scalars(job["out"])
    failed = tb["train/rollout/failed_episodes"]
    assert 1 <= failed[0] <= 4 and failed[1] == 0, (failed, job["during"])
    lost = tb.get("train/rollout/failed/env_session_lost", [0.0])[0]
    unreachable = tb.get("train/rollout/failed/env_unreachable", [0.0])[0]
    assert lost >= 1 and lost + unreachable == failed[0], {k: v for k, v in tb.items() if "failed" in k}


def test_cluster_env_actor_killed_mid_iteration_is_replaced(tmp_path, shared_data, start_model):  # noqa: F811
    def kill_env_actor(live: dict) -> dict:
        address = wait_until(lambda: re.search(r"Ray cluster at (\S+) has 2 node", live["stderr_path"].read_text()),
                             "the Ray cluster's address in the job log", PATIENCE_S).group(1)
        env = dict(os.environ, RAY_AUTH_MODE="disabled")
        done = subprocess.run([sys.executable, str(FAULTS), "kill-env-actor", "--address", address,
                               "--dump", str(live["dump"]), "--timeout", str(2 * PATIENCE_S)],
                              env=env, capture_output=True, text=True, timeout=3 * PATIENCE_S)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    job = run_cpu_job(tmp_path, shared_data, start_model, estimator="progpo", iters=2,
                      extra=["--progpo.zero_signal", "off"], script=CLUSTER_SCRIPT, timeout_s=4 * PATIENCE_S,
                      during=kill_env_actor, RAY_STOP_TIMEOUT="20")
    assert job["rc"] == 0, job["log"][-6000:]
    seen = job["during"]
    killed, replacement = seen["killed"], seen["replacement"]
    assert replacement.rsplit(":", 1)[0] == killed.rsplit(":", 1)[0]  # same pool and slot, next generation
    assert int(replacement.rsplit(":g", 1)[1]) == int(killed.rsplit(":g", 1)[1]) + 1
    # after iteration 1: 2 engines x 2 env actors, every one answering, the killed one gone
    assert len(seen["alive_after_iteration_1"]) == 4 and killed not in seen["alive_after_iteration_1"]
    assert replacement in seen["alive_after_iteration_1"]
    tb = tensorboard_scalars(job["out"])
    assert tb["train/rollout/failed_episodes"][0] >= 1 and tb["train/rollout/failed_episodes"][1] == 0
    assert tb["train/rollout/failed/env_actor_died"][0] == tb["train/rollout/failed_episodes"][0]
    (step1, actor1), (step2, actor2) = dumped_iterations(job["dump"])
    n_failed = int(tb["train/rollout/failed_episodes"][0])
    assert len(real(actor1["rows"])) == 3 * (8 - n_failed)  # every tiny-model ALFWorld episode runs its 3 steps
    assert len(real(actor2["rows"])) == 3 * 8  # iteration 2 at full strength
    assert job["ray_tmp"] not in job["leftover"]
