"""Censored "steps to X" statistics of the learning benchmark: every seed counts, also those that never reach X.

A run reaches success X at env step ``T`` (first iteration whose 3-iteration moving average is >= X)
or never within its budget ``C`` (its total env steps; the run is then right-censored at ``C``). Three
summaries over the seeds of one row:

* **Kaplan-Meier median** of ``T`` with a 95% interval (Kaplan & Meier 1958; ``scipy.stats.ecdf`` on
  ``CensoredData``, log-log Greenwood band, the interval is where the band crosses 1/2, as
  Brookmeyer & Crowley 1982); "not reached" when fewer than half the seeds reach X.
* **Restricted mean** ``RMST(tau) = E[min(T, tau)]`` (Royston & Parmar 2013), with ``tau`` at most the
  budget of every run that never reached X (``research.learning_report.common_tau``: the smallest
  such budget, or the latest crossing when every run reached X). A run that reached X has a known
  ``min(T_i, tau)`` at every ``tau``; one that did not is observed up to its budget ``>= tau``; so the mean
  and its Student-t interval need no censoring model. A seed that never reaches X counts as ``tau``, so
  the restricted mean is a lower bound of the mean of ``T``. ``tau`` depends on which rows are compared
  (a slow row with a short failing budget lowers it for all) and the bootstrap treats it as fixed; the
  oracle's headroom line takes it from its two rows alone (``research.learning_report.headroom_line``).
* **Ratio** of two rows' restricted means with a 95% percentile-bootstrap interval (seeds resampled
  within each row, 4000 resamples).

And one statistic of a run's whole curve, :func:`collapse`: did the run lose what it had learned (its
final success below half of the best it had reached)? A run that reaches X early and then collapses
counts as "reached" in the statistics above, so every learning table reports collapses beside them.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from progpo.run.evaluation import mean_interval


def steps_to_target(steps: Sequence[float], succ: Sequence[float], target: float, window: int = 3) -> float:
    """Env steps at the first iteration whose success, averaged over the last ``window`` iterations,
    reaches ``target``; NaN when never reached."""
    s = np.asarray(succ, dtype=np.float64)
    if s.size == 0:
        return float("nan")
    avg = np.convolve(s, np.ones(window), "full")[: s.size] / np.minimum(np.arange(1, s.size + 1), window)
    hit = np.flatnonzero(avg >= target - 1e-12)
    return float(steps[hit[0]]) if hit.size else float("nan")


@dataclass(frozen=True)
class Censored:
    """Steps-to-X of one row's seeds: ``times`` ``[n]`` (NaN = not reached) and ``budgets`` ``[n]`` (env steps)."""

    times: np.ndarray
    budgets: np.ndarray

    @classmethod
    def of(cls, times: Sequence[float], budgets: Sequence[float]) -> Censored:
        """Validated arrays.

        Raises:
            ValueError: different lengths, no seed, or a reached time beyond its budget.
        """
        t, b = np.asarray(times, dtype=np.float64), np.asarray(budgets, dtype=np.float64)
        if t.shape != b.shape or t.size == 0:
            raise ValueError(f"times and budgets must be non-empty and of equal length, got {t.shape}, {b.shape}")
        if np.any(np.isfinite(t) & (t > b)):
            raise ValueError("a run reached the target after its own budget")
        return cls(t, b)

    @property
    def reached(self) -> np.ndarray:
        """``[n]`` bool, the seed reached X."""
        return np.isfinite(self.times)


def km_median(c: Censored, level: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high) of the Kaplan-Meier estimate; NaN median when S never falls to 1/2, +inf high
    when the upper band never does."""
    r = c.reached
    if not r.any():
        return float("nan"), float("nan"), float("inf")
    data = stats.CensoredData(uncensored=c.times[r], right=c.budgets[~r])
    sf = stats.ecdf(data).sf
    with warnings.catch_warnings():  # undefined where S = 0 or 1 (NaN there; handled below)
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = sf.confidence_interval(level, method="log-log")
    q = sf.quantiles

    def cross(p: np.ndarray) -> float:
        idx = np.flatnonzero(p <= 0.5)
        return float(q[idx[0]]) if idx.size else float("inf")

    med = cross(sf.probabilities)
    low = cross(np.nan_to_num(ci.low.probabilities, nan=0.0))
    high = cross(np.nan_to_num(ci.high.probabilities, nan=1.0))
    return (med if np.isfinite(med) else float("nan")), low, high


def rmst(c: Censored, tau: float) -> tuple[float, float]:
    """(restricted mean ``mean_i min(T_i, tau)``, 95% t half-width); ``tau`` must not exceed the budget of
    any seed that did not reach X (a seed that did is known exactly at every ``tau``: ``min(T_i, tau)``).

    Raises:
        ValueError: ``tau`` above the budget of a seed that never reached X (it is not observed up to ``tau``).
    """
    open_budgets = c.budgets[~c.reached]
    if open_budgets.size and tau > open_budgets.min() + 1e-9:
        raise ValueError(f"tau {tau} exceeds the budget {open_budgets.min()} of a seed that never reached the target")
    x = np.where(c.reached, np.minimum(c.times, tau), tau)
    ci = mean_interval(x, student_t=True)  # Censored holds >= 1 seed
    return ci["mean"], (0.0 if ci["n"] == 1 else (ci["high"] - ci["low"]) / 2)


def rmst_ratio(a: Censored, b: Censored, tau: float, n_boot: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """(RMST(a) / RMST(b), 2.5% and 97.5% percentile-bootstrap bounds), seeds resampled within each row."""
    xa = np.where(a.reached, np.minimum(a.times, tau), tau)
    xb = np.where(b.reached, np.minimum(b.times, tau), tau)
    rng = np.random.default_rng(seed)
    ra = xa[rng.integers(0, xa.size, (n_boot, xa.size))].mean(axis=1)
    rb = xb[rng.integers(0, xb.size, (n_boot, xb.size))].mean(axis=1)
    lo, hi = np.percentile(ra / rb, [2.5, 97.5])
    return float(xa.mean() / xb.mean()), float(lo), float(hi)


def gap_share(a: Censored, ref: Censored, best: Censored, tau: float, n_boot: int = 4000,
              seed: int = 0) -> tuple[float, float, float]:
    """Share of the gap between ``ref`` and ``best`` that ``a`` closes, in restricted mean steps:
    ``(RMST(ref) - RMST(a)) / (RMST(ref) - RMST(best))`` (1 = as fast as ``best``, 0 = as ``ref``, < 0 =
    slower than ``ref``), with 2.5% and 97.5% percentile-bootstrap bounds (each row's seeds resampled on
    their own; resamples in which ``best`` is not faster than ``ref`` are left out).

    Returns:
        (share, low, high); all NaN when ``best`` is not faster than ``ref`` on the seeds themselves.
    """
    x = [np.where(c.reached, np.minimum(c.times, tau), tau) for c in (a, ref, best)]
    gap = x[1].mean() - x[2].mean()
    if not gap > 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    m = [v[rng.integers(0, v.size, (n_boot, v.size))].mean(axis=1) for v in x]
    ok = m[1] - m[2] > 0
    shares = (m[1][ok] - m[0][ok]) / (m[1][ok] - m[2][ok])
    lo, hi = np.percentile(shares, [2.5, 97.5]) if shares.size else (float("nan"), float("nan"))
    return float((x[1].mean() - x[0].mean()) / gap), float(lo), float(hi)


#: :func:`collapse` defaults: peak = best mean of 3 consecutive iterations (the window of
#: :func:`steps_to_target`), final = mean of the last 5 (the final-success column), collapse = final below
#: half the peak and at least 0.1 under it.
PEAK_WINDOW, FINAL_WINDOW, COLLAPSE_RATIO, MIN_DROP = 3, 5, 0.5, 0.1


@dataclass(frozen=True)
class Collapse:
    """Per seed: ``peak`` ``[n]`` (best ``peak_window`` moving average of success), ``final`` ``[n]`` (mean of the
    last ``final_window`` iterations) and ``collapsed`` ``[n]`` bool; success is a share in [0, 1]."""

    peak: np.ndarray
    final: np.ndarray
    collapsed: np.ndarray

    @property
    def seeds(self) -> list[int]:
        """Indices (positions in the input) of the seeds that collapsed."""
        return [int(i) for i in np.flatnonzero(self.collapsed)]

    @property
    def count(self) -> int:
        """Number of seeds that collapsed."""
        return int(self.collapsed.sum())


def collapse(success: Sequence[Sequence[float]], *, peak_window: int = PEAK_WINDOW, final_window: int = FINAL_WINDOW,
             ratio: float = COLLAPSE_RATIO, min_drop: float = MIN_DROP) -> Collapse:
    """Which runs collapsed: their final success fell below ``ratio`` times the best they had reached.

    A pure function of plain per-iteration success curves, so that any learner's runs (the lab's
    log-linear policy, a neural policy trained by the product's trainer) are judged by one rule.

    Args:
        success: one curve per seed, ``[iterations]`` each (lengths may differ): the share of the
            iteration's episodes that succeeded, in [0, 1].
        peak_window: ``w``; peak = max over ``i`` of the mean of iterations ``i .. i+w-1`` (full windows only;
            a curve shorter than ``w`` uses its mean).
        final_window: final = mean of the last ``final_window`` iterations (all of them if fewer).
        ratio: collapse when ``final < ratio * peak`` ...; in (0, 1).
        min_drop: ... and ``peak - final >= min_drop`` (success units, in [0, 1]): a run that never learned
            has nothing to lose, and a halving of a small rate can be sampling noise. How often runs with a
            steady success rate (no learning) are flagged with and without it, at 128 and at 32 episodes per
            iteration: docs/fidelity.md, "Collapse and the stable rate range"; smaller batches need a larger
            ``min_drop``.
    Returns:
        :class:`Collapse` (peak, final, collapsed per seed, in input order).
    Raises:
        ValueError: naming the argument: no curve, an empty curve, a value outside [0, 1] (or not finite),
            a window < 1, ``ratio`` outside (0, 1) or ``min_drop`` outside [0, 1].
    """
    if not (isinstance(peak_window, int) and peak_window >= 1 and isinstance(final_window, int) and final_window >= 1):
        raise ValueError(f"peak_window and final_window must be ints >= 1, got {peak_window!r}, {final_window!r}")
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"ratio must be in (0, 1), got {ratio!r}")
    if not 0.0 <= min_drop <= 1.0:
        raise ValueError(f"min_drop must be in [0, 1], got {min_drop!r}")
    curves = [np.asarray(c, dtype=np.float64).reshape(-1) for c in success]
    if not curves:
        raise ValueError("success must hold at least one curve (one per seed)")
    peak, final = np.zeros(len(curves)), np.zeros(len(curves))
    for i, c in enumerate(curves):
        if c.size == 0:
            raise ValueError(f"success[{i}] is empty")
        bad = ~(np.isfinite(c) & (c >= 0.0) & (c <= 1.0))
        if np.any(bad):
            raise ValueError(f"success[{i}] must hold shares in [0, 1], got {c[bad][:3]}")
        w = min(peak_window, c.size)
        peak[i] = float(np.max(np.convolve(c, np.ones(w) / w, "valid")))
        final[i] = float(np.mean(c[-final_window:]))
    return Collapse(peak, final, (final < ratio * peak) & (peak - final >= min_drop - 1e-12))


def fmt_steps(x: float) -> str:
    """Env steps in thousands (``152k``); ``> budget`` for +inf, ``n/a`` for NaN."""
    if np.isnan(x):
        return "n/a"
    if np.isinf(x):
        return "> budget"
    return f"{x / 1e3:,.0f}k"
