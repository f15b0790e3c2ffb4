"""``python -m benchmarks async-learning``: its figures and verdicts by hand, its command lines, its bad flags."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.async_learning import (AsyncLearningBench, Run, finished_run, main, run_figures, summary_lines,
                                       train_command)
from progpo.run.evaluation import mean_interval


def test_run_figures_by_hand():
    # 4 iterations of 64 episodes: 13 wins first, 40 and 48 in the last two
    tb = {"train/env/success_rate": [13 / 64, 0.5, 40 / 64, 0.75], "train/rollout/num_episodes": [64.0] * 4,
          "train/async/version_lag_max": [0.0, 1.0, 1.0, 0.0]}
    run = run_figures("async", 7, tb, 4)
    assert (run.wins_before, run.n_before, run.wins_after, run.n_after, run.lag_max) == (13, 64, 88, 128, 1.0)
    assert run.rise == pytest.approx(88 / 128 - 13 / 64)
    assert math.isnan(run_figures("sync", 7, {k: v for k, v in tb.items() if "lag" not in k}, 4).lag_max)
    with pytest.raises(ValueError, match="sync-flip seed 3: 3 iterations logged, expected 4"):
        run_figures("sync-flip", 3, {k: v[:3] for k, v in tb.items()}, 4)


def test_failed_episodes_leave_the_denominator_as_env_success_rate_does():
    # 4 of 64 episodes failed in iteration 1: success 30/60 = 0.5 is 30 wins, not round(0.5 * 64) = 32
    tb = {"train/env/success_rate": [0.5, 0.5, 0.5], "train/rollout/num_episodes": [64.0] * 3,
          "train/env/failed_frac": [4 / 64, 0.0, 0.0]}
    run = run_figures("sync", 1, tb, 3)
    assert (run.wins_before, run.n_before, run.wins_after, run.n_after) == (30, 60, 64, 128)


def _runs(mode: str, rises: list[float], before: float = 0.25) -> list[Run]:
    return [Run(mode, s, round(before * 64), 64, round((before + r) * 128), 128, 0.0) for s, r in enumerate(rises)]


def test_verdicts_by_hand():
    # sync rises 0.25, 0.375, 0.5; async 0.25, 0.3125, 0.4375: paired differences 0, -0.0625, -0.0625
    runs = (_runs("sync", [0.25, 0.375, 0.5]) + _runs("async", [0.25, 0.3125, 0.4375])
            + _runs("sync-flip", [-0.25, -0.25, -0.125]) + _runs("async-flip", [-0.25, -0.1875, -0.25]))
    text = "\n".join(summary_lines(runs))
    d = mean_interval([0.0, -0.0625, -0.0625], student_t=True)
    assert f"async against sync: no difference detected (paired over 3 seeds: {d['mean']:+.3f} " \
           f"[{d['low']:+.3f}, {d['high']:+.3f}])" in text
    sync = mean_interval([0.25, 0.375, 0.5], student_t=True)
    assert f"sync: learns (mean rise +0.375 [{sync['low']:+.3f}, {sync['high']:+.3f}])" in text
    assert "async: learns" in text and "sync-flip: fails (mean rise -0.208" in text and "async-flip: fails" in text
    # an async run that learns nothing rises less than sync, paired by seed, and does not learn
    flat = "\n".join(summary_lines(_runs("sync", [0.25, 0.375, 0.5]) + _runs("async", [0.0, 0.015625, -0.015625])))
    assert "async against sync: async rises less" in flat and "async: neither learns nor fails" in flat
    # a flipped run that learns does not fail
    assert "sync-flip: learns" in "\n".join(summary_lines(_runs("sync-flip", [0.25, 0.3, 0.28])))


def test_a_finished_run_is_read_back_and_a_cut_one_is_not(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    for name, n in (("done", 3), ("cut", 2)):
        with SummaryWriter(str(tmp_path / name / "tb" / "run")) as w:
            for step in range(n):
                w.add_scalar("train/env/success_rate", 0.5, step)
                w.add_scalar("train/rollout/num_episodes", 64.0, step)
    run = finished_run("sync", 1, tmp_path / "done", 3)
    assert run is not None and (run.wins_before, run.n_after) == (32, 128) and math.isnan(run.wall_s)
    assert finished_run("sync", 1, tmp_path / "cut", 3) is None
    assert finished_run("sync", 1, tmp_path / "absent", 3) is None


def test_command_lines_differ_only_in_the_mode():
    args = AsyncLearningBench(queue_size=2)
    sync, asyn, flip = (train_command(m, 5, args, Path("/m"), Path("/o")) for m in ("sync", "async", "async-flip"))
    assert asyn == sync + ["--train.async_enable", "--train.async_queue_size", "2"]
    assert flip == asyn + ["--debug.flip_advantages", "true"]
    assert sync[sync.index("--train.seed") + 1] == "5" and sync[sync.index("--actor.adam.lr") + 1] == "0.0003"
    assert sync[sync.index("--ckpt.output_dir") + 1] == "/o/final"  # not OpenRLHF's ./ckpt in the checkout


@pytest.mark.parametrize("argv, says", [
    (["--modes", "sync,fast"], "--modes must list some of"),
    (["--seeds", "1,x"], "--seeds must list integers"),
    (["--seeds", "-1"], "--seeds must list seeds >= 0"),
    (["--train.num_iterations", "2"], "--train.num_iterations must be > 2"),
    (["--queue_size", "0"], "--queue_size must be >= 1"),
])
def test_bad_flags_are_one_line_before_any_run(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    assert exc.value.code == 2 and says in out.err
    assert "async learning benchmark" not in out.out
