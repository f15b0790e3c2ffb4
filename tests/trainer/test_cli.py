"""The small CLIs: plot, data (fails fast, names the folder), evaluate (summaries with intervals)."""

from __future__ import annotations

import json
import math

import pytest

from progpo.agents.types import Episode, StepRecord
from progpo_tests.patience import PATIENCE_S, wait_until
from progpo.run.metrics import MetricsLogger


def _run(tmp_path, name, values):
    log = MetricsLogger(tmp_path / name, tensorboard=False)
    for it, (s, r) in enumerate(values, start=1):
        log.log(it, {"env/success_rate": s, "env/return_mean": r})
    return str(tmp_path / name)


def test_plot_two_runs(tmp_path, capsys):
    from progpo.cli.plot import main

    a = _run(tmp_path, "progpo", [(0.1, 1.0), (0.3, 3.0), (0.5, 5.0)])
    b = _run(tmp_path, "grpo", [(0.1, 1.0), (0.2, 2.0)])
    out = tmp_path / "curves.png"
    assert main([a, b, "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_metrics_logger_rejects_unnamespaced(tmp_path):
    with pytest.raises(ValueError, match="namespaced"):
        MetricsLogger(tmp_path, tensorboard=False).log(1, {"success": 1.0})


def test_data_download_fails_fast_naming_the_folder(tmp_path, capsys, monkeypatch):
    import progpo.cli.data as data
    import progpo.envs.download as download

    monkeypatch.setattr(download, "GDRIVE", "http://127.0.0.1:9/{}")  # discard port: nothing listens
    monkeypatch.setattr(download, "ALFWORLD_HOST", "http://127.0.0.1:9")
    probes, real_probe = [], download.probe
    monkeypatch.setattr(download, "probe", lambda url, timeout_s: probes.append(timeout_s) or real_probe(url, timeout_s))

    def no_fetch(*args, **kwargs):
        raise AssertionError("download went on after the host probe failed")

    monkeypatch.setattr(download, "_fetch", no_fetch)
    # "fast" without a wall clock: one short connect probe (the given timeout), then no transfer at all
    assert data.main(["download", "--dir", str(tmp_path), "--timeout_s", "2"]) == 1
    assert probes == [2.0]
    err = capsys.readouterr().err
    assert str(tmp_path / "webshop") in err and str(tmp_path / "alfworld") in err


def _episode(won, ret, task_type=None, score=None):
    step = StepRecord(prompt_ids=[1], response_ids=[2], logprobs=[0.0], response_text="", action="a",
                      invalid=False, env_reward=ret, reward=ret, terminated=True, truncated=False,
                      anchor_obs="o", prefix_key="k")
    info = {}
    if task_type:
        info["task_type"] = task_type
    if score is not None:
        info["score"] = score
    return Episode(uid="u", traj_id=0, split="test", task_index=0, steps=[step], won=won, info=info)


def test_summaries_with_intervals():
    from progpo.run.evaluation import summarize

    eps = [_episode(True, 10.0, "Pick"), _episode(False, 0.0, "Pick"), _episode(True, 10.0, "Cool"),
           _episode(False, 0.0, "Heat")]
    out = summarize("alfworld", eps)
    assert out["success"]["rate"] == 0.5 and out["success"]["n"] == 4
    # Wilson 95% for 2/4: centre (0.5 + z^2/8)/(1 + z^2/4) = 0.5, half = z*sqrt(1/16 + z^2/64)/(1 + z^2/4)
    z = 1.959963984540054
    half = z * math.sqrt(0.25 / 4 + z * z / 64) / (1 + z * z / 4)
    assert out["success"]["low"] == pytest.approx(0.5 - half) and out["success"]["high"] == pytest.approx(0.5 + half)
    assert out["return"]["mean"] == 5.0
    assert out["return"]["high"] - out["return"]["mean"] == pytest.approx(z * math.sqrt(100 / 3) / 2)
    assert out["success_by_task_type"]["Pick"]["rate"] == 0.5 and out["success_by_task_type"]["Cool"]["n"] == 1
    ws = summarize("webshop", [_episode(True, 10.0, score=1.0), _episode(False, 5.0, score=0.5)])
    assert ws["score"]["mean"] == 0.75 and ws["success"]["wins"] == 1


def test_evaluate_cli_on_webshop(webshop_url, tmp_path, capsys):
    from progpo.cli.evaluate import main

    out = tmp_path / "eval.json"
    rc = main(["--actor.model_name_or_path", "tiny", "--env.name", "webshop", "--env.url", webshop_url, "--eval.num_tasks", "3",
               "--env.max_steps", "2", "--rollout.max_new_tokens", "8", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["split"] == "test" and result["episodes"] == 3 and result["failed_episodes"] == 0
    assert 0.0 <= result["success"]["rate"] <= 1.0 and "score" in result
    assert json.loads(capsys.readouterr().out)["episodes"] == 3
    assert main(["--actor.model_name_or_path", "tiny", "--eval.num_tasks", "0"]) == 2


def test_plot_defaults_into_the_first_run_folder(tmp_path, monkeypatch):
    from progpo.cli.plot import main

    monkeypatch.chdir(tmp_path)
    a = _run(tmp_path, "progpo", [(0.1, 1.0), (0.3, 3.0)])
    assert main([a]) == 0
    assert (tmp_path / "progpo" / "curves.png").is_file()
    assert not (tmp_path / "curves.png").exists()  # nothing dropped into the working folder


def test_evaluate_stops_its_webshop_server_on_sigterm(tmp_path, tiny_model):
    """SIGTERM mid-evaluation unwinds: the WebShop server it started is stopped, not orphaned."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    from progpo.paths import REPO_ROOT

    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "progpo.cli.evaluate", "--actor.model_name_or_path", "tiny", "--env.name", "webshop",
         "--env.max_steps", "15", "--rollout.max_new_tokens", "64"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def webshop_child():
        assert proc.poll() is None, f"evaluate exited with {proc.returncode} before starting its server"
        for kid in psutil.Process(proc.pid).children(recursive=True):
            try:
                if "envs.webshop_server" in " ".join(kid.cmdline()):
                    return kid
            except psutil.Error:  # a short-lived child exited meanwhile
                continue
        return None

    try:
        server = wait_until(webshop_child, "evaluate starting its WebShop server", interval_s=0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=PATIENCE_S) == 128 + signal.SIGTERM
        gone, alive = psutil.wait_procs([server], timeout=PATIENCE_S)
        assert not alive, f"WebShop server {server.pid} left running after SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_metrics_line_shows_cut_responses():
    from progpo.run.metrics import format_metrics

    line = format_metrics(3, {"rollout/invalid_format_frac": 0.2, "rollout/truncated_response_frac": 0.25})
    assert line == "iter 3 valid=0.80 cut=0.25"  # the valid-format share, 1 - invalid
