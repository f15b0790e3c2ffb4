"""PGPO, Potential-Guided Policy Optimization (Zheng et al. 2026, arXiv 2609.02236; no released code)."""

from __future__ import annotations

import numpy as np

from progpo.advantages._prep import group_normalise, group_stats, prepare
from progpo.advantages.batch import StepBatch
from progpo.advantages.config import AdvantageConfig
from progpo.advantages.result import StepAdvantages, finish


def pgpo(batch: StepBatch, cfg: AdvantageConfig, encoder=None) -> StepAdvantages:
    """PGPO: ``A = A^S + w(u) * A^phi`` (arXiv 2609.02236, eq. 11), per task ``u``.

    * Anchor states: the exact observation inside the task's group (Sec. 3.2; ``state_key``, ``auto`` =
      ``obs`` for pgpo); ``G_{i,t}`` is the step return with discount ``eta = gamma`` (eq. 1).
    * ``A^S``: GiGPO's step term, ``G`` standardised among the visits of the step's anchor state (eq. 3;
      ``gigpo_mode``, the project's sample std + ``eps``); 0 for a state visited once.
    * ``Phi(s)`` = mean ``G`` over every visit of ``s`` in the group (eq. 6);
      ``delta_t = pgpo_gamma * Phi(s_{t+1}) - Phi(s_t)`` (eq. 7); on a trajectory's last step, which has no
      successor state, ``Phi(s_{t+1})`` is replaced by the realised final reward, read as that last step's
      reward ``r_{i,T}`` (invalid-action penalty included, as every reward of ``StepBatch``).
    * ``A^phi``: ``delta`` standardised among the visits of the current anchor state (eq. 8, ``gigpo_mode``);
      a singleton or zero-variance group gives exactly 0 (the paper's text).
    * ``w(u) = pgpo_beta * (1 - p_succ(u)) ** pgpo_alpha`` (eq. 10), ``p_succ(u)`` = share of the task's
      trajectories whose final reward is > 0 (eq. 9; the same last-step reward).
    * No episode term (eq. 11; its Table 2 finds one hurts). ``omega`` and ``beta_episode`` are not read.

    Readings where the paper leaves a choice open: the standard deviation of eqs. 3 and 8 is the project's
    sample std (GiGPO's); "final reward" is the last step's reward, which under the project's sparse
    rewards is the outcome reward minus any penalty of that step.

    Args:
        batch: ``S`` steps. cfg: reads ``gamma, eps, gigpo_mode, state_key, pgpo_alpha, pgpo_beta, pgpo_gamma,
            zero_signal``. encoder: unused.
    Returns:
        ``StepAdvantages``: ``[S]`` advantages in the batch's row order; diagnostics add
        ``adv/frac_anchor_ge2`` and ``adv/pgpo_weight_mean`` (mean ``w`` over the batch's tasks).
    Raises:
        ValueError: a bad batch (``StepBatch.validate``), or ``obs_inventory`` without ``state_extra``.
    """
    p = prepare(batch, cfg)
    node, k = p.depth_keys(0)[0]
    a_s, size = group_normalise(node, k, p.G, cfg.gigpo_mode, cfg.eps)
    a_s = np.where(size >= 2, a_s, 0.0)
    _, phi_node, _ = group_stats(node, k, p.G)
    phi = phi_node[node]
    phi_next = np.empty(p.S)
    phi_next[:-1] = phi[1:]
    phi_next[p.last] = p.r[p.last]
    delta = cfg.pgpo_gamma * phi_next - phi
    a_phi, _ = group_normalise(node, k, delta, cfg.gigpo_mode, cfg.eps)
    a_phi = np.where(size >= 2, a_phi, 0.0)
    _, p_succ, _ = group_stats(p.traj_task, p.n_tasks, (p.r[p.last] > 0).astype(np.float64))
    w = cfg.pgpo_beta * (1.0 - p_succ) ** cfg.pgpo_alpha
    adv = a_s + w[p.task] * a_phi
    return finish(p, adv, {"adv/frac_anchor_ge2": float(np.mean(size >= 2)), "adv/pgpo_weight_mean": float(np.mean(w))})
