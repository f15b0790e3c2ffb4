"""G2PO, Group-Graph Policy Optimization (Wang et al. 2026, arXiv 2606.22995; code github Nala-YN/G2PO).

The text this estimator is built from: the paper's abstract ("aggregating identical observations across
different trajectories" into a state-transition graph, "group-aggregation state-value estimation",
actions as "transitions between state nodes", "globally standardizing Temporal Difference (TD) errors
across the entire graph"; the paper's equations with their numbers were not reachable through the
project's search, so none are cited by number) and the released code (``g2po/core_g2po.py``, read, not
copied), which fixes what the abstract leaves open.
"""

from __future__ import annotations

import numpy as np

from progpo.advantages._prep import episode_term, group_normalise, group_stats, prepare
from progpo.advantages.batch import StepBatch
from progpo.advantages.config import AdvantageConfig
from progpo.advantages.result import StepAdvantages, finish


def g2po(batch: StepBatch, cfg: AdvantageConfig, encoder=None) -> StepAdvantages:
    """G2PO: ``A = A^E + omega * (A^node + A^edge)`` on a per-task graph of anchor states.

    Per task ``u``, a node ``n`` is an anchor state (``state_key``: the observation, or observation +
    ``state_extra``); its value is the group-aggregated return ``V(n) = mean G`` over every visit of ``n``
    (revisits in one trajectory count, as in the code). A step is an edge ``n_t -> n_{t+1}`` with value
    ``Q_t = r_t + gamma V(n_{t+1})`` (``V = 0`` after a trajectory's last step, terminated or truncated).

    * ``A^node``: ``Q`` normalised (``gigpo_mode``) over the visits of the step's node; 0 for a node
      visited once (the code's first component, GiGPO's step group with ``Q`` in place of ``G``).
    * ``A^edge``: the TD error ``delta_t`` normalised (``gigpo_mode``) over all steps of the task, i.e. over
      the task's whole graph (the abstract's "globally standardizing TD errors"; the code's second
      component). ``g2po_edge = td`` (default): ``delta = Q_t - V(n_t)``, the textbook TD error
      ``r + gamma V(n') - V(n)`` that the paper's text names. ``progress``: ``delta = Q_t - gamma V(n_t)``,
      the released code's ``V(next) - V(node)`` with node values discounted to the outcome
      (``gamma^(T-t) R``, i.e. ``gamma V`` here; terminal success = the final reward): it also credits
      each step of a lone trajectory for moving toward its outcome.
    * ``A^E``: the project's episode term (1) (``episode_norm``; each trajectory counted once, 0 for a
      one-trajectory task), as for GiGPO/HGPO.

    Where the code and this reading differ, and why:

    * The code's invalid-action penalty (``- 0.1`` on the node term) is already in ``r_t`` here
      (``StepBatch.reward``), so it enters both terms.
    * The code's episode term counts every step of a trajectory in the task's mean/std and gives a
      one-trajectory task ``R`` itself (mean 0, std 1); the project's (1) is used instead (every
      estimator shares it). The code's ``mode`` maps to ``gigpo_mode`` (step terms) and ``episode_norm``.
    * The code's anchor key on ALFWorld is the observation plus the admissible-action list, which
      ``StepBatch`` does not carry; ``state_key = obs_inventory`` is the nearest key there (the inventory
      decides which put/heat/cool actions are admissible). ``auto`` is the observation, as for the other
      baselines (the code's WebShop key is the raw observation).
    * A one-step task's ``A^edge`` is 0 (``x - mean = 0`` exactly), where the code's ``torch.std`` of one
      value is NaN.

    Args:
        batch: ``S`` steps. cfg: reads ``gamma, eps, omega, gigpo_mode, episode_norm, state_key, g2po_edge,
            zero_signal``. encoder: unused.
    Returns:
        ``StepAdvantages``: ``[S]`` advantages in the batch's row order; diagnostics add
        ``adv/frac_anchor_ge2`` (share of steps whose node has >= 2 visits) and ``adv/g2po_nodes``.
    Raises:
        ValueError: a bad batch (``StepBatch.validate``), or ``obs_inventory`` without ``state_extra``.
    """
    p = prepare(batch, cfg)
    node, k = p.depth_keys(0)[0]
    _, v_node, _ = group_stats(node, k, p.G)
    v = v_node[node]
    v_next = np.zeros(p.S)
    v_next[:-1] = v[1:]
    v_next[p.last] = 0.0
    q = p.r + cfg.gamma * v_next
    a_node, size = group_normalise(node, k, q, cfg.gigpo_mode, cfg.eps)
    a_node = np.where(size >= 2, a_node, 0.0)
    delta = q - (v if cfg.g2po_edge == "td" else cfg.gamma * v)
    a_edge, _ = group_normalise(p.task, p.n_tasks, delta, cfg.gigpo_mode, cfg.eps)
    adv = episode_term(p, cfg.episode_norm) + cfg.omega * (a_node + a_edge)
    return finish(p, adv, {"adv/frac_anchor_ge2": float(np.mean(size >= 2)), "adv/g2po_nodes": float(k)})
