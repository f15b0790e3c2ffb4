"""Newcombe's hybrid score interval for a difference of two success rates (progpo.run.evaluation)."""

from __future__ import annotations

import pytest

from progpo.run.evaluation import rate_difference_interval


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
