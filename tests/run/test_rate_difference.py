"""Intervals of progpo.run.evaluation: of a mean (normal approximation or Student's t) and of differences
(Newcombe's hybrid score interval for two success rates, the normal-approximation interval for two means)."""

from __future__ import annotations

import math

import pytest

from progpo.run.evaluation import mean_difference_interval, mean_interval, rate_difference_interval


@pytest.mark.parametrize("wins_a, n_a, wins_b, n_b, low, high", [
    (56, 70, 48, 80, 0.0524, 0.3339),   # Newcombe (1998), Table II, method 10, examples (a)-(d)
    (9, 10, 3, 10, 0.1705, 0.8090),
    (6, 7, 2, 7, 0.0582, 0.8062),
    (5, 56, 0, 29, -0.0381, 0.1926),
])
def test_matches_newcombes_published_intervals(wins_a, n_a, wins_b, n_b, low, high):
    got = rate_difference_interval(wins_a, n_a, wins_b, n_b)
    assert got["diff"] == pytest.approx(wins_a / n_a - wins_b / n_b)
    assert (round(got["low"], 4), round(got["high"], 4)) == (low, high)


@pytest.mark.parametrize("args", [(1, 0, 1, 2), (3, 2, 1, 2), (1, 2, -1, 2)])
def test_bad_counts_raise(args):
    with pytest.raises(ValueError, match="need 0 <= wins <= n"):
        rate_difference_interval(*args)


def test_mean_difference_interval_by_hand():
    """Two normal-approximation intervals of independent means: half-widths add in quadrature."""
    a = {"mean": 0.3, "low": 0.2, "high": 0.4, "n": 10}
    b = {"mean": 0.1, "low": 0.0, "high": 0.2, "n": 10}
    d = mean_difference_interval(a, b)
    assert d["diff"] == pytest.approx(0.2) and d["low"] == pytest.approx(0.2 - 0.141421, abs=1e-6)
    assert d["high"] == pytest.approx(0.2 + 0.141421, abs=1e-6)
    # from raw values it equals 1.96 * sqrt(var_a / n_a + var_b / n_b)
    xa, xb = [0.0, 1.0, 0.5, 0.5], [0.0, 0.0, 0.25, 0.25, 0.5]
    d = mean_difference_interval(mean_interval(xa), mean_interval(xb))
    half = 1.959964 * (0.1666667 / 4 + 0.04375 / 5) ** 0.5
    assert d["diff"] == pytest.approx(0.3) and d["high"] - d["diff"] == pytest.approx(half, rel=1e-5)
    with pytest.raises(ValueError, match="interval of the mean b"):
        mean_difference_interval(a, {"mean": 0.1, "low": float("nan"), "high": float("nan"), "n": 1})


def test_mean_interval_by_hand_normal_and_student_t():
    # mean 0.375, sd 0.125 (squares 0.015625 + 0 + 0.015625 over n - 1 = 2), sd / sqrt(3) = 0.0721688
    xs = [0.25, 0.375, 0.5]
    for student_t, q in ((False, 1.959964), (True, 4.302653)):  # z(0.975); t(0.975, 2 degrees of freedom)
        ci = mean_interval(xs, student_t=student_t)
        half = q * 0.125 / math.sqrt(3)
        assert (ci["mean"], ci["n"]) == (0.375, 3)
        assert ci["low"] == pytest.approx(0.375 - half, abs=1e-6)
        assert ci["high"] == pytest.approx(0.375 + half, abs=1e-6)
    # 90%: t(0.95, 2) = 2.919986
    assert mean_interval(xs, 0.9, student_t=True)["high"] == pytest.approx(0.375 + 2.919986 * 0.0721688, abs=1e-6)
    one, none = mean_interval([0.1], student_t=True), mean_interval([], student_t=True)
    assert one["mean"] == 0.1 and one["n"] == 1 and math.isnan(one["low"]) and math.isnan(one["high"])
    assert none["n"] == 0 and all(math.isnan(none[k]) for k in ("mean", "low", "high"))
