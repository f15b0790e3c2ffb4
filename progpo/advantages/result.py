"""``StepAdvantages`` (what every estimator returns) and the diagnostics all estimators share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from progpo.advantages._prep import Prepared, group_stats


@dataclass(frozen=True)
class StepAdvantages:
    """Per-step advantages and per-batch diagnostics.

    Attributes:
        advantages: ``[S]`` float64, aligned with the rows of the input ``StepBatch`` (its order,
            not sorted); broadcast by the trainer to every action token of that step's response.
        diagnostics: plain-float metrics named ``adv/...`` (defined in ``docs/estimators.md``).
    """

    advantages: np.ndarray
    diagnostics: dict[str, float]


def fragmentation_diagnostics(p: Prepared) -> dict[str, float]:
    """Peer-group and depth-pool sizes of the batch (spec "Diagnostics"), estimator-independent.

    Keys: adv/frac_peer_ge2, adv/peer_size_mean, adv/peer_size_median, and the exact pool sizes of
    ``pool_size_diagnostics``.
    """
    pk, k = p.peer_key()
    size = np.bincount(pk, minlength=k)[pk].astype(np.float64)
    out = {
        "adv/frac_peer_ge2": float(np.mean(size >= 2)),
        "adv/peer_size_mean": float(np.mean(size)),
        "adv/peer_size_median": float(np.median(size)),
    }
    out.update(pool_size_diagnostics(p))
    return out


def pool_size_diagnostics(p: Prepared) -> dict[str, float]:
    """Exact depth-key pool sizes, for d = 0..D: adv/pool_size_d{d}_mean (mean over steps of the number
    of the task's steps sharing the depth-d key, the step itself included: before ``loo`` and before
    semantic expansion) and adv/frac_pool_ge2_d{d} (share of steps whose such pool has >= 2 members)."""
    out = {}
    for d, (codes, kd) in enumerate(p.depth_keys(p.cfg.depths)):
        n = np.bincount(codes, minlength=kd)[codes]
        out[f"adv/pool_size_d{d}_mean"] = float(np.mean(n))
        out[f"adv/frac_pool_ge2_d{d}"] = float(np.mean(n >= 2))
    return out


def equal_return_tasks(p: Prepared, which: str | None = None) -> np.ndarray:
    """``[S]`` bool: the step's task has no return signal, every trajectory's episode return equal
    (up to float rounding: range <= 1e-12 * max |return| of the task). A one-trajectory task counts.

    ``which`` (default ``p.cfg.zero_signal_return``): ``sum`` compares ``R_i = sum_t r_{i,t}``,
    ``discounted`` compares ``G_{i,0} = sum_t gamma^t r_{i,t}`` (``[M]``, the first step's return-to-go).
    """
    ret = p.G[p.first] if (which or p.cfg.zero_signal_return) == "discounted" else p.R
    hi = np.full(p.n_tasks, -np.inf)
    lo = np.full(p.n_tasks, np.inf)
    np.maximum.at(hi, p.traj_task, ret)
    np.minimum.at(lo, p.traj_task, ret)
    scale = np.maximum(np.abs(hi), np.abs(lo))
    return ((hi - lo) <= 1e-12 * scale)[p.task]


def finish(p: Prepared, adv_sorted: np.ndarray, diag: dict[str, float]) -> StepAdvantages:
    """Unsort, zero the tasks without a return signal (``zero_signal='task'``; with ``'batch'`` only when
    no task of the batch has one), add the advantage statistics
    (and fragmentation if ``diagnostics='full'``), check finiteness.

    Raises:
        FloatingPointError: a NaN/inf advantage or diagnostic (a bug; never returned).
    """
    if p.cfg.diagnostics == "full":
        for key, value in fragmentation_diagnostics(p).items():
            diag.setdefault(key, value)
    a = adv_sorted.astype(np.float64, copy=False)
    flat = equal_return_tasks(p)
    if p.cfg.zero_signal == "task" or (p.cfg.zero_signal == "batch" and np.all(flat)):
        a = np.where(flat, 0.0, a)
    diag.update({
        "adv/frac_equal_return_steps": float(np.mean(flat)),
        "adv/mean": float(np.mean(a)),
        "adv/std": float(np.std(a)),
        "adv/min": float(np.min(a)),
        "adv/max": float(np.max(a)),
        "adv/frac_zero": float(np.mean(a == 0.0)),
        "adv/num_steps": float(p.S),
        "adv/num_tasks": float(p.n_tasks),
        "adv/num_trajectories": float(p.n_traj),
    })
    if not np.all(np.isfinite(a)):
        bad = int(np.flatnonzero(~np.isfinite(a))[0])
        raise FloatingPointError(f"estimator {p.cfg.estimator!r} produced a non-finite advantage at sorted row {bad}")
    for key, value in diag.items():
        if not np.isfinite(value):
            raise FloatingPointError(f"estimator {p.cfg.estimator!r} produced a non-finite diagnostic {key}")
    return StepAdvantages(advantages=p.unsort(a.copy()), diagnostics={k: float(v) for k, v in diag.items()})


def task_std(p: Prepared, x: np.ndarray) -> np.ndarray:
    """``[S]`` sample std of ``x`` over the steps of each step's task (0 for one-step tasks)."""
    cnt, _, ssd = group_stats(p.task, p.n_tasks, x)
    var = np.divide(ssd, cnt - 1.0, out=np.zeros_like(ssd), where=cnt > 1)
    return np.sqrt(np.maximum(var, 0.0))[p.task]
