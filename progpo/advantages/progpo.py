"""ProGPO (spec components (1)-(7), extensions E1-E3): exact-prefix peers + transition credit from
rollout-based state potentials (semantic expansion, inverse-variance fusion across history depths).

Dimension names: ``S`` steps (sorted rows, see ``_prep``), ``D+1`` depths.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from progpo.advantages._prep import (Prepared, combine, discounted_returns, episode_term, group_stats, normalise, prepare,
                                     sample_std)
from progpo.advantages.batch import StepBatch
from progpo.advantages.closure import closure
from progpo.advantages.config import AdvantageConfig
from progpo.advantages.result import StepAdvantages, equal_return_tasks, finish, pool_size_diagnostics, task_std
from progpo.advantages.semantic import Encoder, expand_depth0

logger = logging.getLogger(__name__)
_warned_no_encoder = False


def peer_term(p: Prepared) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Spec (2): peer advantage ``A^P`` and reliability ``rho`` per step.

    ``A^P = (G - mean_P G) / (std_P G + eps)`` for ``|P| >= 2``; ``rho = (|P|-1)/(|P|-1+kappa)``;
    ``rho = 0`` for singletons, for a group holding every trajectory of the task once at one step
    index (it repeats the episode term), and everywhere when ``use_peer`` is False.
    Returns (A^P ``[S]``, rho ``[S]``, diagnostics).
    """
    cfg = p.cfg
    pk, k = p.peer_key()
    cnt, mean, ssd = group_stats(pk, k, p.G)
    size = cnt[pk]
    a_p = np.where(size >= 2, normalise(p.G, mean[pk], sample_std(cnt, ssd)[pk], "mean_std_norm", cfg.eps), 0.0)
    # Groups that are "every trajectory of the task, once each, at the same step index".
    n_traj_task = np.bincount(p.traj_task, minlength=p.n_tasks).astype(np.float64)
    distinct_traj = np.bincount(np.unique(pk * p.n_traj + p.traj) // p.n_traj, minlength=k).astype(np.float64)
    _, _, t_ssd = group_stats(pk, k, p.t.astype(np.float64))
    g_task = np.zeros(k, dtype=np.int64)
    g_task[pk] = p.task
    whole = (distinct_traj == n_traj_task[g_task]) & (cnt == n_traj_task[g_task]) & (t_ssd == 0.0)
    rho = np.where(size >= 2, (size - 1.0) / (size - 1.0 + cfg.kappa), 0.0)
    rho = np.where(whole[pk], 0.0, rho)
    if not cfg.use_peer:
        rho = np.zeros(p.S)
    diag = {"adv/frac_peer_used": float(np.mean(rho > 0)), "adv/rho_mean": float(np.mean(rho))}
    return a_p, rho, diag


def _pool_stats(p: Prepared, codes: np.ndarray, k: int, loo: bool):
    """Per-step (n, mu, ssd) of the step's pool in groups ``codes``; ``ssd = (n-1) s2`` (sample).

    With ``loo`` the step's own trajectory is removed (``n = 0``: empty pool).
    """
    cnt, mean, ssd = group_stats(codes, k, p.G)
    if not loo:
        return cnt[codes], mean[codes], ssd[codes]
    gt, kgt = combine(codes, p.traj)
    x = p.G - mean[codes]  # centred on the full group mean: stable one-pass LOO moments
    c_gt = np.bincount(gt, minlength=kgt).astype(np.float64)[gt]
    s1_gt = np.bincount(gt, weights=x, minlength=kgt)[gt]
    s2_gt = np.bincount(gt, weights=x * x, minlength=kgt)[gt]
    s1_g = np.bincount(codes, weights=x, minlength=k)[codes]
    n = cnt[codes] - c_gt
    s1 = s1_g - s1_gt
    s2 = ssd[codes] - s2_gt
    mx = np.divide(s1, n, out=np.zeros(p.S), where=n > 0)
    out_ssd = np.maximum(s2 - n * mx * mx, 0.0)
    return n, mean[codes] + mx, np.where(n > 0, out_ssd, 0.0)


def reward_scale(p: Prepared) -> float:
    """The reward unit ``s`` the fusion's variances are measured in (spec (3)/(5), ``sigma2_floor_ref``).

    ``batch``: the largest |r| of the batch (1 when every reward is 0). Multiplying every reward by
    c > 0 multiplies ``s`` by c, so the fusion weights and every normalised advantage stay the same.
    ``success_reward`` (the paper reading): 1, i.e. absolute reward units.
    """
    if p.cfg.sigma2_floor_ref == "success_reward":
        return 1.0
    s = float(np.max(np.abs(p.r)))
    return s if s > 0 else 1.0


def sigma2_task(p: Prepared, scale: float) -> np.ndarray:
    """``[S]`` sigma2_u / scale**2: sample variance of G over the task's steps in units of ``scale``,
    floored at ``sigma2_floor_coef`` (``batch``: the floor is coef * (max |r|)**2) or, with
    ``sigma2_floor_ref='success_reward'`` (scale 1), at ``coef * success_reward**2`` (spec (3))."""
    cfg = p.cfg
    floor = cfg.sigma2_floor if cfg.sigma2_floor_ref == "success_reward" else cfg.sigma2_floor_coef
    return np.maximum((task_std(p, p.G) / scale) ** 2, floor)


def mc_potentials(p: Prepared, encoder: Encoder | None, timings: dict | None = None):
    """Spec (3)-(5): fused Monte-Carlo potential ``Phi`` per step.

    Returns (Phi ``[S]``, diagnostics). Per depth d: pool ``S_d`` (key ``k_d``), ``mu_d``, ``n_d``,
    ``s2~_d = ((n_d-1) s2_d + m0 sigma2_u) / (n_d - 1 + m0)``, ``e_d = s2~_d / n_d`` (in units of
    ``reward_scale(p)**2``); fusion
    ``Phi = sum_d w_d mu_d / sum_d w_d`` with ``w_d = 1/(e_d + eta)`` (ivw), ``1/(e_d + (mu_d - mu_ref)^2)``
    (ivw_bias; ``mu_ref`` = the deepest non-empty depth, D unless loo emptied it) or 1 (none).
    """
    cfg = p.cfg
    loo = cfg.potential_pool == "loo"
    nd = cfg.depths + 1
    n = np.zeros((nd, p.S))
    mu = np.zeros((nd, p.S))
    ssd = np.zeros((nd, p.S))
    t0 = time.perf_counter()
    for d, (codes, k) in enumerate(p.depth_keys(cfg.depths)):
        n[d], mu[d], ssd[d] = _pool_stats(p, codes, k, loo)
    diag = pool_size_diagnostics(p)  # exact pools, before loo and expansion
    used = np.zeros(p.S, dtype=bool)
    _tick(timings, "potentials", t0)
    if encoder is not None and cfg.semantic_expansion:
        t0 = time.perf_counter()
        need = n[0] < cfg.min_peers
        if np.any(need):
            rows, n_e, mu_e, ssd_e, used_e = expand_depth0(p, encoder, need, loo)
            ok = n_e > 0
            n[0, rows[ok]], mu[0, rows[ok]], ssd[0, rows[ok]] = n_e[ok], mu_e[ok], ssd_e[ok]
            used[rows] = used_e & ok
        _tick(timings, "embeddings", t0)
    # the pools the potentials used: after loo, and at depth 0 after semantic expansion (n_eff)
    diag.update({f"adv/pool_used_size_d{d}_mean": float(np.mean(n[d])) for d in range(nd)})
    diag.update({f"adv/frac_pool_used_ge2_d{d}": float(np.mean(n[d] >= 2)) for d in range(nd)})
    t0 = time.perf_counter()
    phi, weights = fuse(p, n, mu, ssd)
    diag["adv/frac_semantic_expansion"] = float(np.mean(used))
    for d in range(nd):
        diag[f"adv/fusion_weight_d{d}_mean"] = float(np.mean(weights[d]))
    _tick(timings, "fusion", t0)
    return phi, diag


def closure_targets(p: Prepared) -> tuple[Prepared, dict[str, float]]:
    """``potential_target='closure'``: ``p`` with each step's closure target in place of its return ``G``.

    The target of step ``(i, t)`` is ``y = r_{i,t} + gamma * W(x_{i,t})``: ``x`` its successor on the task's merged
    graph (the next step's anchor state; after the last step an absorbing node worth 0, as ``Phi`` is 0 there in
    (6)) and ``W`` the graph's fixed point ``W = rbar + gamma M W`` (``progpo.advantages.closure`` with the step
    rewards; CRBC arXiv 2609.35082, eqs. 7-9; GRAFT arXiv 2609.28963, eqs. 5-7). The potential pools (3)-(5)
    then average ``y`` instead of ``G``: an anchor state's exact depth-0 pool holds its visits, whose mean ``y``
    is ``W(s)``, its closure value (CRBC's depth ``K = infinity``), where the visit average of ``G`` is CRBC's
    ``K = 0`` (eqs. 6, 10: the same empirical process and aggregation, only the reach changes). Deeper depths
    and semantic expansion average the same targets over their pools, and the fusion weights use their spread,
    exactly as they use ``G``'s.

    Readings where the papers leave the mapping onto ProGPO's potentials open:

    * Rewards: the closure carries the step rewards ``r`` that ``G`` sums (the success reward, WebShop's partial
      score, the invalid-action penalty), so ``W`` is the expected ``G`` of the state under the group's empirical
      process. The papers state the closure for a binary outcome and no intermediate reward (CRBC Sec. 3:
      ``V`` is then the discounted success probability; GRAFT Sec. 3.3 writes the step advantage as
      ``r + gamma V' - V`` and drops ``r`` as 0); on such rewards ``W = success_reward * V / gamma`` exactly (the
      ``1 / gamma``: CRBC's return ``beta^(T_i - t + 1) R_i`` discounts the outcome once more than ``G``).
    * Discount: ProGPO's ``gamma`` (not ``crbc_beta`` / ``graft_gamma``), the discount of ``G`` and of the credit
      ``C = r + gamma Phi' - Phi``; on a task whose anchor states never branch or merge the closure then equals
      the visit average exactly.
    * A step-limit cut ends in the absorbing node (0 after the last step, as (6) sets ``Phi``); success and
      failure differ by the reward of the last step.
    * ``potential_pool='loo'`` leaves the step's own trajectory out of the pools, not out of the graph (the
      closure is solved once per task from every rollout of the group).

    Returns:
        (the ``Prepared`` view with ``G`` = ``[S]`` targets in reward units, sharing ``p``'s cached keys;
        diagnostics ``adv/closure_nodes``).
    """
    g = closure(p, p.cfg.gamma, reward=p.r)
    targets = p.r + p.cfg.gamma * g.values[g.succ]
    return dataclasses.replace(p, G=targets), {"adv/closure_nodes": float(g.n)}


def fuse(p: Prepared, n: np.ndarray, mu: np.ndarray, ssd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spec (5) fusion over depths (+ the loo fallback of (3)); returns (Phi ``[S]``, normalised weights ``[D+1, S]``)."""
    cfg = p.cfg
    valid = n > 0
    # variances in units of the reward scale s (sigma2_floor_ref): e_d / s**2, eta in those units
    s = reward_scale(p)
    sigma2 = sigma2_task(p, s)
    s2t = np.divide(ssd / s / s + cfg.m0 * sigma2, n - 1.0 + cfg.m0, out=np.ones_like(ssd), where=valid)
    e = np.divide(s2t, n, out=np.ones_like(ssd), where=valid)
    if cfg.fusion == "ivw":
        w = 1.0 / (e + cfg.eta)
    elif cfg.fusion == "ivw_bias":
        deepest = (n.shape[0] - 1) - np.argmax(valid[::-1], axis=0)
        ref = mu[deepest, np.arange(p.S)]
        w = 1.0 / (e + ((mu - ref) / s) ** 2)
    else:
        w = np.ones_like(mu)
    w = np.where(valid, w, 0.0)
    wsum = w.sum(axis=0)
    any_valid = wsum > 0
    phi = np.divide((w * mu).sum(axis=0), wsum, out=np.zeros(p.S), where=any_valid)
    lo = np.where(valid, mu, np.inf).min(axis=0)
    hi = np.where(valid, mu, -np.inf).max(axis=0)
    phi = np.where(any_valid & (lo == hi), lo, phi)  # identical depth estimates: exactly that value
    if not np.all(any_valid):
        phi = np.where(any_valid, phi, _loo_fallback(p))
    weights = np.divide(w, wsum, out=np.zeros_like(w), where=any_valid)
    return phi, weights


def _loo_fallback(p: Prepared) -> np.ndarray:
    """Spec (3) loo fallback, other trajectories only: the task's mean G at the same step index over the
    other trajectories, else its mean G over the other trajectories, else (a task with one trajectory:
    nothing can inform the step) the step's own G, so that its transition credit is exactly 0."""
    same_t, _ = combine(p.task, p.t)
    own_t, _ = combine(same_t, p.traj)
    own, _ = combine(p.task, p.traj)
    phi = p.G.copy()
    for codes, mine in ((p.task, own), (same_t, own_t)):  # coarse first, the finer one overwrites
        n_all, tot_all = np.bincount(codes).astype(np.float64)[codes], np.bincount(codes, weights=p.G)[codes]
        n_own, tot_own = np.bincount(mine).astype(np.float64)[mine], np.bincount(mine, weights=p.G)[mine]
        phi = np.divide(tot_all - tot_own, n_all - n_own, out=phi, where=n_all > n_own)
    return phi


def transition_credit(p: Prepared, phi: np.ndarray) -> np.ndarray:
    """Spec (6): ``C_t = r_t + gamma * Phi_{t+1} - Phi_t`` with ``Phi = 0`` after the last step."""
    nxt = np.zeros(p.S)
    nxt[:-1] = phi[1:]
    nxt[p.last] = 0.0
    return (p.r + p.cfg.gamma * nxt) - phi


def accumulate_credit(p: Prepared, c_hat: np.ndarray) -> np.ndarray:
    """GAE-style accumulation of the normalised transition credit (``credit_lambda``):
    ``A^C_t = sum_{k=0}^{T-1-t} (gamma lambda)^k C^_{t+k}`` over the rest of the trajectory
    (Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE", eq. 16, with the potential
    Phi in place of the value V and the per-task normalised residual ``C^`` of spec (6) in place of
    delta; nothing is bootstrapped after the last step, as in (6)).
    ``[S]`` in, ``[S]`` out (sorted rows). lambda = 0 returns ``C^``.
    """
    return discounted_returns(c_hat, p.last, p.t, p.cfg.gamma * p.cfg.credit_lambda)


def normalise_credit(p: Prepared, credit: np.ndarray) -> np.ndarray:
    """Spec (6): ``C^ = C / (std_u C + eps)`` per task (not mean-centred), ``[S]`` sorted rows.

    A task whose credits have no spread (sample std <= 1e-12 * max |C| of the task: a one-step task,
    or every C equal) gets ``C^ = 0``: there is nothing to compare, and the division would return
    ``C / eps`` (orders of magnitude above every other advantage, e.g. for a one-step truncated task
    whose final observation loops back to its own graph node).
    """
    cnt = np.bincount(p.task, minlength=p.n_tasks)
    std = task_std(p, credit)
    peak = np.zeros(p.n_tasks)
    np.maximum.at(peak, p.task, np.abs(credit))
    flat = (std <= 1e-12 * peak[p.task]) | (cnt[p.task] < 2)
    return np.where(flat, 0.0, credit / (std + p.cfg.eps))


def cap_rms(p: Prepared, adv: np.ndarray) -> tuple[np.ndarray, float]:
    """``rms_cap``: ``adv`` ``[S]`` (sorted rows) times ``f = min(1, rms_cap / RMS)``, and ``f``.

    ``RMS = sqrt(mean A^2)`` over the steps whose advantage ``zero_signal`` will leave (all steps with
    ``off``; the tasks with a return signal with ``task``; none when ``batch`` zeroes the whole batch).
    The spec's (7) adds the step-level terms to the episode term, so a row whose credit agrees with the
    returns takes a larger REINFORCE step at the same learning rate than GRPO (whose episode term has an
    RMS just under 1 per task with a return signal); the cap keeps the step-level terms to sharing credit
    among the steps. Scaling every advantage of a batch by one positive factor keeps their signs and
    ranks. ``rms_cap = 0``, an all-zero batch or no kept step: ``f = 1``.
    """
    cfg = p.cfg
    if cfg.rms_cap <= 0:
        return adv, 1.0
    flat = equal_return_tasks(p)
    if cfg.zero_signal == "task":
        keep = ~flat
    elif cfg.zero_signal == "batch" and np.all(flat):
        keep = np.zeros(p.S, dtype=bool)
    else:
        keep = np.ones(p.S, dtype=bool)
    if not np.any(keep):
        return adv, 1.0
    rms = float(np.sqrt(np.mean(adv[keep] ** 2)))
    f = min(1.0, cfg.rms_cap / rms) if rms > 0 else 1.0
    return adv * f, f


def timing_factor(p: Prepared) -> np.ndarray:
    """``[S]`` factor of ``timing_scale='spread'`` (1 with ``unit`` or ``zero_signal_return='sum'``).

    Timing-only tasks (every ``R_i`` equal, the ``G_{i,0}`` not: :func:`equal_return_tasks` by ``sum`` and not by
    ``discounted``) get ``min(1, sd_u(G_0) / sd_ref)``, ``sd_u`` the sample std of the task's ``G_{i,0}``
    (``[M]`` -> per task), ``sd_ref = sqrt(mean over the tasks v with an R spread of sd_v(G_0)**2)``; every
    other step, and every step of a batch without an R spread, gets 1.
    """
    if p.cfg.timing_scale == "unit" or p.cfg.zero_signal_return == "sum":
        return np.ones(p.S)
    flat_sum = equal_return_tasks(p, "sum")
    timing = flat_sum & ~equal_return_tasks(p, "discounted")
    if not np.any(timing) or np.all(flat_sum):
        return np.ones(p.S)
    g0 = p.G[p.first]
    cnt, _, ssd = group_stats(p.traj_task, p.n_tasks, g0)
    sd = sample_std(cnt, ssd)
    signal = np.zeros(p.n_tasks, dtype=bool)
    signal[p.task[~flat_sum]] = True
    ref = float(np.sqrt(np.mean(sd[signal] ** 2)))
    factor = np.minimum(1.0, sd / ref) if ref > 0 else np.ones(p.n_tasks)
    return np.where(timing, factor[p.task], 1.0)


def _tick(timings: dict | None, stage: str, t0: float) -> None:
    if timings is not None:
        timings[stage] = timings.get(stage, 0.0) + (time.perf_counter() - t0) * 1e3


def progpo_estimate(batch: StepBatch, cfg: AdvantageConfig, encoder: Encoder | None = None,
                    timings: dict | None = None) -> StepAdvantages:
    """ProGPO, spec (7): ``A = beta_episode A^E + omega (rho A^P + (1 - rho) C^)``, ``C^ = C / (std_u C + eps)``;
    with ``credit_lambda > 0``, ``C^`` is then accumulated over the rest of the trajectory (``accumulate_credit``);
    with ``rms_cap > 0`` the batch's advantages are then scaled to an RMS of at most ``rms_cap`` (``cap_rms``).

    Args:
        batch: the rollout batch (``S`` steps). cfg: the config. encoder: texts -> unit vectors, or
            None (semantic expansion off; logged). timings: optional dict filled with milliseconds
            per stage (grouping / potentials / embeddings / fusion), for the benchmark.
    Returns:
        ``StepAdvantages`` with ``[S]`` float64 advantages in the batch's row order.
    Raises:
        ValueError: bad batch; obs_inventory without state_extra; graph with a trajectory longer than max_steps.
    """
    global _warned_no_encoder
    t0 = time.perf_counter()
    p = prepare(batch, cfg)
    a_e = episode_term(p, cfg.episode_norm)
    a_p, rho, diag = peer_term(p)
    p.depth_keys(cfg.depths)
    _tick(timings, "grouping", t0)
    expansion = cfg.semantic_expansion and encoder is not None
    if cfg.semantic_expansion and encoder is None and not _warned_no_encoder:
        logger.warning("ProGPO: no encoder given, semantic expansion is off (adv/semantic_expansion_on = 0)")
        _warned_no_encoder = True
    diag["adv/semantic_expansion_on"] = float(expansion)
    enc = encoder if expansion else None
    if cfg.potential_estimator == "graph":
        from progpo.advantages.graph import graph_credit

        credit, gdiag = graph_credit(p, enc, timings)
    else:
        pools, gdiag = p, {}
        if cfg.potential_target == "closure":
            t0 = time.perf_counter()
            pools, gdiag = closure_targets(p)
            _tick(timings, "potentials", t0)
        phi, mc_diag = mc_potentials(pools, enc, timings)
        gdiag.update(mc_diag)
        credit = transition_credit(p, phi)
    diag.update(gdiag)
    t0 = time.perf_counter()
    diag["adv/frac_zero_credit"] = float(np.mean(credit == 0.0))
    c_hat = normalise_credit(p, credit)
    if cfg.credit_lambda > 0:
        c_hat = accumulate_credit(p, c_hat)
    if not cfg.use_potential:
        c_hat = np.zeros(p.S)
    step = np.where(rho > 0, rho * a_p, 0.0) + (1.0 - rho) * c_hat
    adv, diag["adv/rms_scale"] = cap_rms(p, (cfg.beta_episode * a_e + cfg.omega * step) * timing_factor(p))
    _tick(timings, "fusion", t0)
    return finish(p, adv, diag)


def progpo(batch: StepBatch, cfg: AdvantageConfig, encoder: Encoder | None = None) -> StepAdvantages:
    """Registry entry for ``estimator='progpo'`` (see ``progpo_estimate``)."""
    return progpo_estimate(batch, cfg, encoder)
