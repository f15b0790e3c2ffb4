"""CRBC, Cross-Rollout Bellman Closure (Ren et al. 2026, arXiv 2609.35082; no released code found)."""

from __future__ import annotations

import numpy as np

from progpo.advantages._prep import combine, episode_term, prepare
from progpo.advantages.batch import StepBatch
from progpo.advantages.closure import closure
from progpo.advantages.config import AdvantageConfig
from progpo.advantages.result import StepAdvantages, finish


def crbc(batch: StepBatch, cfg: AdvantageConfig, encoder=None) -> StepAdvantages:
    """CRBC: ``A = w_G * A^G + w_S * A^S(s, a)`` (arXiv 2609.35082, eq. 14), per task group.

    * Empirical process (eqs. 1, 5): the anchor states of the group (``state_key``; ``auto`` = observation
      + ``state_extra``, the nearest the batch carries to the paper's environment key, App. C.2) with each
      step's executed action (invalid actions share one symbol) and successor: the next anchor state, or
      the absorbing success / failure node after the last step (``progpo.advantages.closure``; a step-limit
      cut is a failure). Counts give ``P(x | s, a)`` and ``mu(a | s)``, unsmoothed.
    * ``V`` solves ``(I - beta M) V = b`` (eqs. 8-9, ``beta = crbc_beta``; the closure's fixed point);
      ``Q(s, a) = beta * sum_x P(x | s, a) V(x)`` with ``V(z+) = 1``, ``V(z-) = 0`` (eqs. 7, 9).
    * ``A^S(s, a) = (Q - V) / max(sigma(s), crbc_sigma_min)`` with ``sigma(s)^2 = sum_a mu (Q - V)^2``
      (Prop. 2), 0 at anchors with fewer than two distinct actions (eq. 13). All visits of one
      (anchor, action) pair share it.
    * ``A^G``: the trajectory-level group advantage (eq. 3), the project's episode term (1)
      (``episode_norm``; ``R_i`` = sum of the step rewards); ``w_G = beta_episode``, ``w_S = omega``.

    Readings where the paper leaves a choice open: the closure is on the binary outcome (a success is a
    terminated last step with reward ``>= success_reward``), and the invalid-action penalty, which the paper
    applies "before advantage computation" without saying how it enters the closure, enters through
    ``A^G``'s returns only. The std of eq. 3 is the project's sample std.

    Args:
        batch: ``S`` steps. cfg: reads ``crbc_beta, eps, omega, beta_episode, episode_norm, state_key,
            crbc_sigma_min, success_reward, zero_signal``. encoder: unused.
    Returns:
        ``StepAdvantages``: ``[S]`` advantages in the batch's row order; diagnostics add
        ``adv/frac_credit_anchor`` (share of steps at anchors with >= 2 actions) and ``adv/closure_nodes``.
    Raises:
        ValueError: a bad batch (``StepBatch.validate``), or ``obs_inventory`` without ``state_extra``.
    """
    p = prepare(batch, cfg)
    g = closure(p, cfg.crbc_beta)
    pair_code, k = combine(g.node, p.action_code(True))
    n_visits = np.bincount(pair_code, minlength=k).astype(np.float64)
    q_pair = cfg.crbc_beta * np.bincount(pair_code, weights=g.values[g.succ], minlength=k) / n_visits
    gain = q_pair[pair_code] - g.values[g.node]
    visits = np.bincount(g.node, minlength=g.n).astype(np.float64)
    sigma = np.sqrt(np.bincount(g.node, weights=gain * gain, minlength=g.n) / visits)
    pair_node = np.zeros(k, dtype=np.int64)
    pair_node[pair_code] = g.node
    n_actions = np.bincount(pair_node, minlength=g.n)
    credited = n_actions[g.node] >= 2
    a_s = np.where(credited, gain / np.maximum(sigma[g.node], cfg.crbc_sigma_min), 0.0)
    adv = cfg.beta_episode * episode_term(p, cfg.episode_norm) + cfg.omega * a_s
    return finish(p, adv, {"adv/frac_credit_anchor": float(np.mean(credited)), "adv/closure_nodes": float(g.n)})
