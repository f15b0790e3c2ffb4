"""Censored "steps to X" statistics of the learning benchmark: every seed counts, also those that never reach X.

A run reaches success X at env step ``T`` (first iteration whose 3-iteration moving average is >= X)
or never within its budget ``C`` (its total env steps; the run is then right-censored at ``C``). Three
summaries over the seeds of one row:

* **Kaplan-Meier median** of ``T`` with a 95% interval (Kaplan & Meier 1958; ``scipy.stats.ecdf`` on
  ``CensoredData``, log-log Greenwood band, the interval is where the band crosses 1/2, as
  Brookmeyer & Crowley 1982); "not reached" when fewer than half the seeds reach X.
* **Restricted mean** ``RMST(tau) = E[min(T, tau)]`` (Royston & Parmar 2013), with ``tau`` at most the
  budget of every run that never reached X (``progpo.lab.learning_report.common_tau``: the smallest
  such budget, or the latest crossing when every run reached X). A run that reached X has a known
  ``min(T_i, tau)`` at every ``tau``; one that did not is observed up to its budget ``>= tau``; so the mean
  and its Student-t interval need no censoring model. A seed that never reaches X counts as ``tau``, so
  the restricted mean is a lower bound of the mean of ``T``. ``tau`` depends on which rows are compared
  (a slow row with a short failing budget lowers it for all) and the bootstrap treats it as fixed.
* **Ratio** of two rows' restricted means with a 95% percentile-bootstrap interval (seeds resampled
  within each row, 4000 resamples).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


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
    if x.size < 2:
        return float(x.mean()), 0.0
    return float(x.mean()), float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))


def rmst_ratio(a: Censored, b: Censored, tau: float, n_boot: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """(RMST(a) / RMST(b), 2.5% and 97.5% percentile-bootstrap bounds), seeds resampled within each row."""
    xa = np.where(a.reached, np.minimum(a.times, tau), tau)
    xb = np.where(b.reached, np.minimum(b.times, tau), tau)
    rng = np.random.default_rng(seed)
    ra = xa[rng.integers(0, xa.size, (n_boot, xa.size))].mean(axis=1)
    rb = xb[rng.integers(0, xb.size, (n_boot, xb.size))].mean(axis=1)
    lo, hi = np.percentile(ra / rb, [2.5, 97.5])
    return float(xa.mean() / xb.mean()), float(lo), float(hi)


def fmt_steps(x: float) -> str:
    """Env steps in thousands (``152k``); ``> budget`` for +inf, ``n/a`` for NaN."""
    if np.isnan(x):
        return "n/a"
    if np.isinf(x):
        return "> budget"
    return f"{x / 1e3:,.0f}k"
