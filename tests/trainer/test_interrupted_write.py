"""An interrupted write loses nothing (issue 44, item 3).

A real ``python -m progpo.cli.train`` (3 iterations, two checkpoints kept) SIGKILLs itself at one point of
iteration 3's writes (``tests/trainer/kill_during_save.py``): half its ``metrics.jsonl`` line written; the
checkpoint's temporary folder half written, or complete before its rename; after the rename, before
``latest``; after ``latest``, before rotation; with the oldest checkpoint moved away, not yet deleted. Each time
the run folder's newest checkpoint loads, ``metrics.jsonl`` reads without a torn line, no rotation has left
fewer than two complete checkpoints, and ``--ckpt.load_enable`` finishes the run with exactly the weights and
records of the uninterrupted run. The readers and writers are checked on hand-made torn files too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from progpo.paths import REPO_ROOT
from progpo.run.checkpoint import CheckpointManager
from progpo.run.metrics import MetricsLogger, read_metrics
from progpo_tests.patience import PATIENCE_S

FLAGS = ["--actor.model_name_or_path", "tiny", "--env.name", "alfworld_like", "--env.max_steps", "2",
         "--env.num_tasks", "6", "--rollout.batch_size", "1", "--rollout.n_samples_per_prompt", "2",
         "--rollout.max_new_tokens", "8", "--train.num_iterations", "3", "--train.batch_size", "64",
         "--train.micro_batch_size", "8", "--actor.adam.lr", "1e-3", "--actor.entropy_coef", "0.01",
         "--ckpt.max_num", "2", "--logger.progress_bar", "false", "--logger.tensorboard_dir", "none"]

#: stage killed at -> the newest complete checkpoint it leaves.
STAGES = {"metrics": "iter_000002", "partial": "iter_000002", "written": "iter_000002",
          "published": "iter_000003", "marked": "iter_000003", "rotating": "iter_000003"}


def _weights(run) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(CheckpointManager(run).latest() / "hf" / "model.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    from progpo.cli.train import main

    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    assert main([*FLAGS, "--ckpt.path", str(run)]) == 0
    return run


def _killed_run(run, stage: str) -> None:
    dist_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")  # this process's own rendezvous
    env = {k: v for k, v in os.environ.items() if k not in dist_vars} | {"PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, str(REPO_ROOT / "tests" / "trainer" / "kill_during_save.py"), stage, "3", "--",
            *FLAGS, "--ckpt.path", str(run)]
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=3 * PATIENCE_S)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(STAGES))
def test_kill_during_a_write_then_resume(uninterrupted, tmp_path, stage):
    from progpo.cli.train import main

    run = tmp_path / "run"
    _killed_run(run, stage)
    mgr = CheckpointManager(run)
    assert mgr.latest().name == STAGES[stage]
    assert len(mgr.complete()) >= 2  # rotation never deleted an old one before the new one was complete
    records = read_metrics(run)  # no torn line reaches a reader
    assert [r["iteration"] for r in records] == ([1, 2] if stage == "metrics" else [1, 2, 3])
    if stage == "metrics":
        assert not (run / "metrics.jsonl").read_text().endswith("\n")  # the kill did tear the last line
    assert main([*FLAGS, "--ckpt.path", str(run), "--ckpt.load_enable"]) == 0
    assert [p.name for p in mgr.complete()] == ["iter_000002", "iter_000003"]
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in lines] == [1, 2, 3]
    want, got = _weights(uninterrupted), _weights(run)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_metrics_reader_skips_a_torn_last_line_and_the_writer_repairs_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 1, "env/success_rate": 0.5}\n{"iteration": 2, "env/succ')
    assert read_metrics(tmp_path) == [{"iteration": 1, "env/success_rate": 0.5}]
    logger = MetricsLogger(tmp_path, tensorboard=False)  # a resumed run: the torn record is cut off first
    logger.truncate_after(1)
    logger.log(2, {"env/success_rate": 0.25})
    assert path.read_text() == ('{"iteration": 1, "env/success_rate": 0.5}\n'
                                '{"iteration": 2, "env/success_rate": 0.25}\n')


def test_newest_complete_checkpoint_wins_over_a_lagging_marker(tmp_path):
    root = tmp_path / "checkpoints"
    for name in ("iter_000001", "iter_000002", ".tmp-iter_000003", ".old-iter_000000"):
        (root / name).mkdir(parents=True)
        (root / name / "trainer_state.json").write_text("{}")
    (root / "latest").write_text("iter_000001")  # killed between iter_000002's rename and the marker's
    assert CheckpointManager(tmp_path).latest().name == "iter_000002"
