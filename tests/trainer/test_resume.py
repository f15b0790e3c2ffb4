"""Kill-and-resume: a run stopped after iteration 1 and resumed ends with exactly the parameters of
the uninterrupted run (same next batch, same RNG); checkpoints are never half-written."""

from __future__ import annotations

import json
import shutil

import pytest

import numpy as np
import torch

from progpo.run.checkpoint import CheckpointManager
from progpo.trainer.loop import TaskSampler


def _simulate_kill_after_iteration_1(src, dst):
    """Copy a finished run as it was when killed during iteration 2: the iteration-2 checkpoint was
    still a temporary folder, ``latest`` pointed at iteration 1, metrics had a partial extra line."""
    shutil.copytree(src, dst)
    ckpts = dst / "checkpoints"
    (ckpts / "iter_000002").rename(ckpts / ".tmp-iter_000002")
    (ckpts / "latest").write_text("iter_000001")
    with (dst / "metrics.jsonl").open() as f:
        first = f.readline()
    (dst / "metrics.jsonl").write_text(first + json.dumps({"iteration": 2, "env/success_rate": 0.5}) + "\n")


def test_resume_gives_identical_parameters(e2e_runs, train_run, tmp_path):
    full = e2e_runs.get("webshop", "progpo")  # uninterrupted: 2 iterations
    resumed_dir = tmp_path / "resumed"
    _simulate_kill_after_iteration_1(full.save_path, resumed_dir)
    resumed = train_run(resumed_dir, "--env.name", "webshop", "--algo.advantage.estimator", "progpo",
                        "--progpo.zero_signal", "off",  # as the e2e run it resumes (tests/trainer/conftest.py)
                        "--env.url", e2e_runs.webshop_url, "--ckpt.load_enable")
    assert [m["iteration"] for m in resumed.history] == [2]  # only the missing iteration ran
    # same next batch: the resumed iteration saw exactly the same rollout and losses
    a, b = full.history[1], resumed.history[0]
    for key in ("env/return_mean", "rollout/num_steps", "rollout/prompt_len_mean", "adv/mean", "adv/std"):
        assert a[key] == b[key], key
    assert abs(a["loss/total"] - b["loss/total"]) < 1e-6
    # identical parameters
    pa, pb = full.actor.model.state_dict(), resumed.actor.model.state_dict()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name
    # same RNG and data order afterwards
    assert full.rng.bit_generator.state == resumed.rng.bit_generator.state
    assert full.sampler.state_dict() == resumed.sampler.state_dict()
    # the stale temp checkpoint was cleaned, metrics hold each iteration once
    ckpts = resumed_dir / "checkpoints"
    assert not list(ckpts.glob(".tmp-*"))
    assert [json.loads(x)["iteration"] for x in (resumed_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_fresh_run_refuses_existing_checkpoints(e2e_runs, train_run):
    full = e2e_runs.get("webshop", "progpo")
    with pytest.raises(ValueError, match="--ckpt.load_enable"):
        train_run(full.save_path, "--env.url", e2e_runs.webshop_url)


def test_latest_ignores_half_written(tmp_path):
    mgr = CheckpointManager(tmp_path)
    (tmp_path / "checkpoints" / "iter_000001").mkdir(parents=True)
    (tmp_path / "checkpoints" / "iter_000001" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoints" / ".tmp-iter_000002").mkdir()
    (tmp_path / "checkpoints" / "iter_000003").mkdir()  # no trainer_state.json: incomplete
    assert mgr.latest().name == "iter_000001"


def test_task_sampler_order_and_state():
    s = TaskSampler(num_tasks=5, seed=3)
    first = s.next(3) + s.next(3) + s.next(4)
    assert sorted(first[:5]) == list(range(5)) and sorted(first[5:]) == list(range(5))  # each task once per epoch
    t = TaskSampler(num_tasks=5, seed=3)
    t.next(3)
    state = t.state_dict()
    u = TaskSampler(num_tasks=5, seed=3)
    u.load_state_dict(state)
    assert u.next(7) == first[3:10]
    with pytest.raises(ValueError, match="seed"):
        TaskSampler(num_tasks=5, seed=4).load_state_dict(state)
    assert np.array_equal(TaskSampler(5, 3)._perm(), TaskSampler(5, 3)._perm())


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted(e2e_runs, tmp_path):
    """A real ``python -m progpo.cli.train`` process is SIGKILLed once its first checkpoint exists;
    ``--ckpt.load_enable`` then finishes the run with the uninterrupted run's exact parameters."""
    import os
    import signal
    import subprocess
    import sys

    from safetensors.torch import load_file

    from progpo_tests.patience import PATIENCE_S, wait_until

    full = e2e_runs.get("webshop", "progpo")
    run_dir = tmp_path / "killed"
    argv = [sys.executable, "-m", "progpo.cli.train", *e2e_runs.flags("webshop", "progpo"), "--ckpt.path", str(run_dir)]
    from progpo.paths import REPO_ROOT

    dist_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")  # this process's own rendezvous
    env = {k: v for k, v in os.environ.items() if k not in dist_vars} | {"PYTHONPATH": str(REPO_ROOT)}
    log = (tmp_path / "killed.log").open("w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def checkpointed() -> bool:
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            return (run_dir / "checkpoints" / "iter_000001" / "trainer_state.json").exists()

        # polling a file another process writes; a training iteration: twice the suite's patience
        wait_until(checkpointed, "the first checkpoint of the run to kill", timeout_s=2 * PATIENCE_S, interval_s=0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=PATIENCE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert CheckpointManager(run_dir).latest() is not None
    rc = subprocess.run([*argv, "--ckpt.load_enable"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        timeout=3 * PATIENCE_S)
    assert rc.returncode == 0, rc.stderr.decode()[-2000:]
    final = CheckpointManager(run_dir).latest()
    assert final.name == "iter_000002"
    resumed = load_file(str(final / "hf" / "model.safetensors"))
    uninterrupted = load_file(str(full.ckpt.latest() / "hf" / "model.safetensors"))
    assert resumed.keys() == uninterrupted.keys()
    for name in resumed:
        assert torch.equal(resumed[name], uninterrupted[name]), name


def test_save_path_on_a_file_is_refused_before_the_model_is_built(tmp_path, webshop_url, capsys):
    from progpo.cli.train import main

    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    rc = main(["--actor.model_name_or_path", "tiny", "--ckpt.path", str(blocker), "--env.url", webshop_url,
               "--train.num_iterations", "1", "--logger.progress_bar", "false", "--logger.tensorboard_dir", "none"])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"--ckpt.path {blocker} is a file" in err
    assert blocker.read_text() == "keep me"


def test_metrics_of_a_run_without_checkpoint_are_not_appended_to(tmp_path, webshop_url, capsys):
    # a run stopped before its first checkpoint left metrics.jsonl; a new run there appended its
    # iteration 1 to the old one (two records for iteration 1). Now: refused, or replaced with --ckpt.load_enable.
    from progpo.cli.train import main

    run = tmp_path / "run"
    run.mkdir()
    old = json.dumps({"iteration": 1, "env/success_rate": 0.5}) + "\n"
    (run / "metrics.jsonl").write_text(old)
    args = ["--actor.model_name_or_path", "tiny", "--ckpt.path", str(run), "--env.url", webshop_url,
            "--train.num_iterations", "1", "--rollout.batch_size", "1", "--rollout.n_samples_per_prompt", "2",
            "--env.max_steps", "2", "--logger.progress_bar", "false", "--logger.tensorboard_dir", "none"]
    assert main(args) == 2
    assert "holds metrics.jsonl of an earlier run" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == old  # nothing lost
    assert main([*args, "--ckpt.load_enable"]) == 0
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [1]
    assert "env/success_rate" in records[0] and "loss/optimizer_steps" in records[0]
