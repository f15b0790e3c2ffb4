"""``python -m benchmarks async``'s per-iteration figures, by hand from a run's TensorBoard scalars."""

from __future__ import annotations

import math

import pytest

from benchmarks.async_mode import iterations


def test_iterations_by_hand():
    # generation of batch 1 [0, 10], batch 2 [10, 16] beside update 1 [10, 14], update 2 [16, 18]
    tb = {"train/timeline/generation_start": [0.0, 10.0], "train/timeline/generation_end": [10.0, 16.0],
          "train/timeline/train_start": [10.0, 16.0], "train/timeline/train_end": [14.0, 18.0],
          "train/async/version_lag_mean": [0.0, 1.0], "train/async/version_lag_max": [0.0, 1.0]}
    first, second = iterations(tb)
    assert (first.wall_s, first.gen_s, first.upd_s) == (14.0, 10.0, 4.0)
    assert first.overlap == pytest.approx(4.0 / 14.0)  # [10, 14]: update 1 beside generation 2
    assert (second.wall_s, second.gen_s, second.upd_s) == (4.0, 6.0, 2.0)
    assert second.overlap == pytest.approx(0.0)  # [14, 18]: generation 2 ends at 16, update 2 starts at 16
    assert (second.lag_mean, second.lag_max, second.mixed) == (1.0, 1.0, 0.0)


def test_a_run_without_version_figures_reads_nan():
    tb = {"train/timeline/generation_start": [0.0], "train/timeline/generation_end": [1.0],
          "train/timeline/train_start": [1.0], "train/timeline/train_end": [2.0]}
    (only,) = iterations(tb)
    assert math.isnan(only.lag_mean) and math.isnan(only.lag_max) and only.mixed == 0.0


def test_run_logged_names_the_exit_code_the_timeout_and_the_log(tmp_path):
    import sys

    from benchmarks.async_mode import run_logged

    log = tmp_path / "runs" / "a.log"
    wall = run_logged([sys.executable, "-c", "import os; print(os.environ['PROGPO_X'])"], log, 60, PROGPO_X="seen")
    assert wall >= 0 and log.read_text().strip() == "seen"  # the extra environment reached it; the folder was made
    with pytest.raises(RuntimeError, match=r"exited 3; log .*a\.log; tail:\nbye"):
        run_logged([sys.executable, "-c", "print('bye'); raise SystemExit(3)"], log, 60)
    with pytest.raises(RuntimeError, match=r"passed --timeout_s 0\.5; log "):
        run_logged([sys.executable, "-c", "import time; time.sleep(30)"], log, 0.5)
