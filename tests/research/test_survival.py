"""Censored steps-to-X statistics, against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from research.survival import Censored, collapse, gap_share, km_median, rmst, rmst_ratio, steps_to_target

NAN = float("nan")


def _curve(success, steps):
    """A run's curves only (``steps`` / ``success`` ``[I]``), all that the restricted-mean helpers read."""
    from types import SimpleNamespace

    return SimpleNamespace(steps=np.asarray(steps, float), success=np.asarray(success, float))


def test_km_median_counts_the_seeds_that_never_reach():
    # 3 of 5 seeds reach X at 100, 200, 300; two are censored at 450 and 480.
    # S = 4/5 after 100, 3/5 after 200, 2/5 after 300: the median is 300.
    c = Censored.of([100, 200, 300, NAN, NAN], [500, 500, 500, 450, 480])
    med, lo, hi = km_median(c)
    assert med == 300 and lo <= med and hi == float("inf")  # 5 seeds: the upper band never reaches 1/2
    # only 2 of 5 reach: S never falls to 1/2
    assert np.isnan(km_median(Censored.of([100, 200, NAN, NAN, NAN], [500] * 5))[0])
    assert np.isnan(km_median(Censored.of([NAN, NAN], [500, 500]))[0])


def test_km_median_interval_narrows_with_many_seeds():
    c = Censored.of([100, 120, 130, 140, 150, 160, 170, 180, 190, 200] * 2, [500] * 20)
    med, lo, hi = km_median(c)
    assert med == 150 and 100 <= lo < med < hi <= 200


def test_restricted_mean_counts_censored_seeds_at_tau():
    c = Censored.of([100, 200, 300, NAN, NAN], [500, 500, 500, 450, 480])
    m, h = rmst(c, 450)
    assert m == pytest.approx((100 + 200 + 300 + 450 + 450) / 5)
    assert h > 0
    with pytest.raises(ValueError, match="tau"):
        rmst(c, 470)  # seed 4's budget is 450: not observed up to 470
    q, lo, hi = rmst_ratio(c, c, 450)
    assert q == 1.0 and lo < 1.0 < hi


def test_steps_to_target_uses_a_moving_average():
    assert steps_to_target([10, 20, 30, 40], [0.1, 0.9, 0.9, 0.9], 0.8, window=2) == 30
    assert np.isnan(steps_to_target([10, 20], [0.1, 0.2], 0.8))
    with pytest.raises(ValueError, match="budget"):
        Censored.of([600], [500])


def test_pick_lr_prefers_the_fastest_rate_then_the_higher_final_success():
    from research import learning_report as lr
    from research.learner import RunResult

    def run(succ):  # 100 env steps per iteration
        s = np.asarray(succ, dtype=float)
        return RunResult(None, np.arange(1, s.size + 1) * 100.0, s, np.zeros(0, np.int64), {}, 0.0)

    fast, slow = run([0.9] * 6), run([0.1, 0.1, 0.9, 0.9, 0.9, 0.9])
    never_hi, never_lo = run([0.5] * 6), run([0.2] * 6)
    assert lr.pick_lr({3.0: [slow], 10.0: [fast]}, 0.8, 600.0) == 10.0
    assert lr.pick_lr({3.0: [never_lo], 10.0: [never_hi]}, 0.8, 600.0) == 10.0  # tie at tau: final success
    c = lr.censored([fast, never_hi], 0.8)
    assert c.times[0] == 100.0 and np.isnan(c.times[1]) and c.budgets.tolist() == [600.0, 600.0]


def test_ratio_table_against_several_references(tmp_path, capsys):
    import pickle

    from research import learning_report as lr
    from research.learner import RunResult

    def run(first_hit):  # 100 env steps per iteration, 6 iterations; success 0.9 from iteration first_hit
        s = np.array([0.1] * first_hit + [0.9] * (6 - first_hit))
        return RunResult(None, np.arange(1, 7) * 100.0, s, np.zeros(0, np.int64), {}, 0.0)

    # 3-iteration moving average (shorter at the start) first >= 0.8: a at iteration 1 (100 steps); b at 4
    # (0.1, 0.9, 0.9 -> 0.63 at 3; 0.9 at 4: 400); c at 6 (600 = tau); final success (last 5): c 0.58
    final = {"a": [run(0), run(0)], "b": [run(1), run(1)], "c": [run(3), run(3)]}
    with open(tmp_path / "x-runs.pkl", "wb") as fh:
        pickle.dump({"final": final}, fh)
    text = lr.ratio_table(final, ["a", "b"])
    assert "| a | 0.900 ± 0.000 | 0/2 | 100 ± 0 | 1.00 [1.00, 1.00] | 0.25 [0.25, 0.25] |" in text
    assert "| c | 0.580 ± 0.000 | 0/2 | 600 ± 0 | 6.00 [6.00, 6.00] | 1.50 [1.50, 1.50] |" in text
    # with a (every run as fast as it) as the best row: c closes (400 - 600) / (400 - 100) = -2/3 of b's gap
    text = lr.ratio_table(final, ["b"], oracle="a")
    assert "| c | 0.580 ± 0.000 | 0/2 | 600 ± 0 | 1.50 [1.50, 1.50] | -0.67 [-0.67, -0.67] |" in text
    with pytest.raises(ValueError, match=r"reference rows \['z'\]"):
        lr.ratio_table(final, ["z"])
    assert lr.main(["--runs", str(tmp_path / "x-runs.pkl"), "--references", "b"]) == 0
    assert "Oracle headroom" not in capsys.readouterr().out  # no oracle row in this run
    assert lr.main(["--runs", str(tmp_path / "x-runs.pkl"), "--references", "c,b", "--oracle", "a"]) == 0
    # opened by a's headroom over the first reference, c: 100 / 600 over the two rows' own horizon, 600
    assert capsys.readouterr().out.startswith("**Oracle headroom**: a's env steps to 80% / c's = **0.17 [0.17, 0.17]**")


def test_restricted_mean_needs_only_the_unreached_seeds_observed_up_to_tau():
    # seed 0 reached at 100 and stopped at 300 (a fast learner's short budget): min(100, 500) = 100 is known
    c = Censored.of([100, 600, NAN], [300, 1000, 800])
    m, _ = rmst(c, 500)
    assert m == pytest.approx((100 + 500 + 500) / 3)
    with pytest.raises(ValueError, match="never reached"):
        rmst(c, 900)  # seed 2 never reached the target and is observed only up to 800


def test_common_tau_is_the_smallest_budget_of_an_unreached_run():
    from research.learning_report import common_tau

    fast = _curve([0.9] * 3, [10, 20, 30])  # reached 0.8 at 30 (3-iteration moving average), budget 30
    slow = _curve([0.1, 0.1, 0.9, 0.9, 0.9], [50, 100, 150, 200, 250])  # reached at 250
    never = _curve([0.1] * 4, [60, 120, 180, 240])
    assert common_tau([[fast], [slow]], 0.8) == 250  # everyone reached: the latest crossing, nobody capped
    assert common_tau([[fast], [slow, never]], 0.8) == 240  # the unreached run is observed up to 240


def test_collapse_against_hand_computed_peaks_and_finals():
    fell = [0.1, 0.5, 0.6, 0.7, 0.2, 0.0, 0.0, 0.1, 0.0, 0.0]
    # 3-iteration means: 0.4, 0.6, 0.5, 0.3, 0.0667, 0.0333, 0.0333, 0.0333 -> peak 0.6;
    # final = mean(0, 0, 0.1, 0, 0) = 0.02 < 0.3: collapsed
    learned = [0.1, 0.3, 0.5, 0.7, 0.9, 0.9, 0.8, 0.9, 0.9, 0.9]  # peak 0.9, final 0.88: not collapsed
    never = [0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # peak 0.0333, drop 0.0333 < 0.1: not collapsed
    at_half = [0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.25]  # final 0.25 = half the peak 0.5: not below it
    below_half = [0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.0]  # final 0.2 < 0.25: collapsed
    c = collapse([fell, learned, never, at_half, below_half, [0.6]])
    assert c.peak == pytest.approx([0.6, 0.9, 0.1 / 3, 0.5, 0.5, 0.6])
    assert c.final == pytest.approx([0.02, 0.88, 0.0, 0.25, 0.2, 0.6])
    assert c.collapsed.tolist() == [True, False, False, False, True, False]
    assert c.seeds == [0, 4] and c.count == 2
    # the minimum drop is a parameter: without it the run that never learned counts as collapsed
    assert collapse([never], min_drop=0.0).collapsed.tolist() == [True]
    # a brief spike to 0.4 and back to 0: peak (0.07 + 0.4 + 0) / 3 = 0.157, final 0: a drop of 0.157 >= 0.1
    spike = [0.02, 0.01, 0.07, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert collapse([spike]).collapsed.tolist() == [True]
    assert collapse([spike], min_drop=0.2).collapsed.tolist() == [False]
    # other windows: peak over 1 iteration = 0.7; final over the last 2 = 0.0 -> collapsed
    c = collapse([fell], peak_window=1, final_window=2, ratio=0.1)
    assert (c.peak[0], c.final[0], c.count) == (0.7, 0.0, 1)


@pytest.mark.parametrize("kwargs, match", [
    ({"success": []}, "at least one curve"), ({"success": [[]]}, r"success\[0\] is empty"),
    ({"success": [[0.5, 1.5]]}, r"success\[0\] must hold shares"), ({"success": [[0.5, NAN]]}, "shares"),
    ({"success": [[0.5]], "ratio": 1.0}, "ratio"), ({"success": [[0.5]], "min_drop": -0.1}, "min_drop"),
    ({"success": [[0.5]], "peak_window": 0}, "peak_window"),
])
def test_collapse_refuses_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        collapse(**kwargs)


def test_gap_share_against_hand_computed_values():
    ref = Censored.of([400, 400], [600, 600])
    best = Censored.of([100, 100], [600, 600])
    half = Censored.of([200, 300], [600, 600])  # restricted mean 250: (400 - 250) / (400 - 100) = 0.5
    g, lo, hi = gap_share(half, ref, best, 600)
    assert g == pytest.approx(0.5) and lo == pytest.approx(1 / 3) and hi == pytest.approx(2 / 3)
    assert gap_share(ref, ref, best, 600)[0] == 0.0 and gap_share(best, ref, best, 600)[0] == 1.0
    assert all(np.isnan(gap_share(half, best, ref, 600)))  # the "best" row is slower: no gap to close


def test_pick_lr_never_prefers_a_rate_at_which_a_seed_collapsed():
    from types import SimpleNamespace

    from research import learning_report as lr
    from research.learner import RunResult

    def run(succ, seed=0):
        s = np.asarray(succ, dtype=float)
        return RunResult(SimpleNamespace(seed=seed), np.arange(1, s.size + 1) * 100.0, s, np.zeros(0, np.int64),
                         {}, 0.0)

    fast_but_fell = run([0.9, 0.9, 0.9, 0.9, 0.0, 0.0, 0.0, 0.0, 0.0], seed=7)  # reaches 80% at 100, then 0
    fast = run([0.9] * 9, seed=8)
    slow = run([0.1, 0.1, 0.1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9], seed=9)
    assert lr.collapsed_seeds([fast_but_fell, fast, slow]) == [7]
    assert lr.fmt_collapsed([fast_but_fell, fast]) == "1/2 (seeds 7)" and lr.fmt_collapsed([slow]) == "0/1"
    # lr 10 is faster on every seed but one of its seeds collapsed: lr 3 is chosen
    assert lr.pick_lr({3.0: [slow, slow], 10.0: [fast_but_fell, fast]}, 0.8, 900.0) == 3.0
    # when every rate has a collapse, the fewest collapses win, then speed
    assert lr.pick_lr({3.0: [fast_but_fell, fast_but_fell], 10.0: [fast_but_fell, slow]}, 0.8, 900.0) == 10.0
    table = lr.stability_table({"x": {3.0: [slow, slow], 10.0: [fast_but_fell, fast], 20.0: [slow]}}, {"x": 3.0})
    assert "| x | **0/2, 0.90** | 1/2 (seeds 7), 0.45 | 0/1, 0.90 | 3, 20 |" in table
    assert lr._fmt_rates([1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 5.0]) == "1-3" and lr._fmt_rates([], [1.0]) == "none"


def test_main_table_states_steps_to_50_percent_once_when_the_target_is_50_percent():
    from types import SimpleNamespace

    from research import learning_report as lr
    from research.learner import RunResult

    s = np.array([0.2, 0.6, 0.6, 0.9, 0.9, 0.9])
    runs = {"a": [RunResult(SimpleNamespace(seed=0), np.arange(1, 7) * 100.0, s, np.zeros(0, np.int64), {}, 0.0)]}
    header = lambda target: lr.main_table(runs, {"a": 1.0}, target, 600.0, None).splitlines()[0]  # noqa: E731
    assert header(0.5).count("to 50%") == 3  # KM median, reaching seeds' mean, restricted mean: once each
    assert header(0.8).count("KM median to 50%") == 1 and header(0.8).count("KM median to 80%") == 1
    assert len(header(0.5).split("|")) == len(header(0.8).split("|")) - 1


def test_the_headroom_line_takes_its_horizon_from_the_oracle_and_the_reference_alone():
    """A third row whose failing runs end early (a policy that buys at once) lowers the block's common tau;
    the oracle's headroom over GiGPO is a property of the task setting and must not move with it."""
    from research.learning_report import common_tau, headroom_line

    def reach_at(k, n=10):  # 0.9 from iteration k on: the 3-iteration average reaches 0.8 at iteration k + 2
        return _curve([0.1] * k + [0.9] * (n - k), [100 * (i + 1) for i in range(n)])

    final = {"gigpo": [reach_at(5), reach_at(6)],  # reach 0.8 at 800 and 900 env steps
             "oracle": [reach_at(1), reach_at(2)],  # at 400 and 500
             "graft": [_curve([0.0] * 10, [10 * (i + 1) for i in range(10)])]}  # never, over 100 env steps
    assert common_tau(list(final.values()), 0.8) == 100  # the block's horizon: everyone capped at 100
    line = headroom_line(final, 0.8, "gigpo", "oracle")
    # the two rows' own horizon is their latest crossing, 900: (400 + 500) / (800 + 900) = 0.53; at the
    # block's 100 both rows would read 100 and the ratio 1.00
    assert "**0.53 [" in line and "tau 1k, the two rows' own horizon" in line, line
    assert headroom_line({k: final[k] for k in ("gigpo", "oracle")}, 0.8, "gigpo", "oracle") == line
