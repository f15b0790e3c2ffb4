"""A dying worker costs its episodes, not the run: the CPU jobs of ``test_cpu_job.py`` with a fault
injected while they run (from outside, as a crash or an operator would).

* the cluster-shaped job (``dry_run_cluster_cpu.sh``) has its env-actor kill in ``test_cpu_job.py``'s
  one cluster run (``test_cluster_env_actor_killed_mid_iteration_is_replaced``), not a second run here.
* ``train_progpo_webshop_cpu.sh`` against a WebShop server this test owns: the server is stopped and
  started again while episodes run. Episodes whose sessions it lost fail as ``env_session_lost``; the
  next iteration has no failure; exit 0.
* the same script with its engine (the CPU stand-in of OpenRLHF's vLLM engine actor) killed (SIGKILL,
  as the kernel's OOM killer would) in the middle of the rollout: OpenRLHF does not restart engines and
  each engine is a member of the weight-sync group, so the run cannot go on; it stops with exit 4 and
  one last line naming the engine, within the test's patience (no hang).

Cost on a 2-core machine: each one-node job 1-2 minutes.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import requests

from progpo.run.failures import EXIT_ENGINE_DIED
from progpo_tests.patience import PATIENCE_S, wait_until

from .test_cpu_job import (  # noqa: F401 - start_model is a fixture
    _free_port,
    run_cpu_job,
    start_model,
    tensorboard_scalars,
)

pytestmark = pytest.mark.slow

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
    # Every lost episode is counted under one of the two kinds a restart makes. Which one is timing: a request
    # the server was serving when it stopped fails as env_unreachable (it may have been applied, so it is not
    # resent); one that reaches the restarted server fails as env_session_lost. A CI run (2026-12-04) counted
    # both of its failed episodes as env_unreachable, with a ~2 s restart well inside the ~15 s of connect
    # retries, so the split is not asserted here; tests/envs/test_webshop_restart.py pins each kind.
    lost = tb.get("train/rollout/failed/env_session_lost", [0.0])[0]
    unreachable = tb.get("train/rollout/failed/env_unreachable", [0.0])[0]
    assert lost + unreachable == failed[0], {k: v for k, v in tb.items() if "failed" in k}
