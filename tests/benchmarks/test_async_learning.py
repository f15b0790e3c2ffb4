"""``python -m benchmarks async-learning``: its figures and verdicts by hand, its command lines, its bad flags."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.async_learning import AsyncLearningBench, Run, main, run_figures, summary_lines, train_command


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


def _runs(mode: str, rises: list[float], before: float = 0.25) -> list[Run]:
    return [Run(mode, s, round(before * 64), 64, round((before + r) * 128), 128, 0.0) for s, r in enumerate(rises)]


def test_verdicts_by_hand():
    # sync rises 0.25, 0.375, 0.5 (mean 0.375, sd 0.125); async 0.25, 0.3125, 0.4375; flips fall
    runs = (_runs("sync", [0.25, 0.375, 0.5]) + _runs("async", [0.25, 0.3125, 0.4375])
            + _runs("sync-flip", [-0.25, -0.25, -0.125]) + _runs("async-flip", [-0.25, -0.1875, -0.25]))
    text = "\n".join(summary_lines(runs))
    half = 1.959964 * 0.125 / math.sqrt(3)  # the normal interval of mean_interval, sd 0.125 over 3 seeds
    assert f"{0.375 - half:+.3f}, {0.375 + half:+.3f}" in text
    assert "async's rise is within sync's: difference -0.042" in text
    assert "sync learns: mean rise +0.375" in text and "async learns" in text
    assert "sync-flip fails: mean rise -0.208" in text and "async-flip fails" in text
    # an async run that learns nothing is outside sync's interval, and says so
    flat = "\n".join(summary_lines(_runs("sync", [0.25, 0.375, 0.5]) + _runs("async", [0.0, 0.015625, -0.015625])))
    assert "async's rise is NOT within sync's" in flat and "async does NOT learn" in flat
    # a flipped run that learns does not fail
    assert "sync-flip does NOT fail" in "\n".join(summary_lines(_runs("sync-flip", [0.25, 0.25])))


def test_command_lines_differ_only_in_the_mode():
    args = AsyncLearningBench(queue_size=2)
    sync, asyn, flip = (train_command(m, 5, args, Path("/m"), Path("/o")) for m in ("sync", "async", "async-flip"))
    assert asyn == sync + ["--train.async_enable", "--train.async_queue_size", "2"]
    assert flip == asyn + ["--debug.flip_advantages", "true"]
    assert sync[sync.index("--train.seed") + 1] == "5" and sync[sync.index("--actor.adam.lr") + 1] == "0.0005"


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
