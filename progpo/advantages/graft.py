"""GRAFT, graph-based faithful step-level credit assignment (Yao et al. 2026, arXiv 2609.28963; code announced at
github xcyao00/GRAFT, not reachable)."""

from __future__ import annotations

import numpy as np

from progpo.advantages._prep import combine, group_normalise, prepare
from progpo.advantages.batch import StepBatch
from progpo.advantages.closure import Closure, closure
from progpo.advantages.config import AdvantageConfig
from progpo.advantages.result import StepAdvantages, finish


def graft(batch: StepBatch, cfg: AdvantageConfig, encoder=None) -> StepAdvantages:
    """GRAFT: Graph-GAE step advantages on the task's trajectory graph, normalised per node (arXiv 2609.28963).

    * Graph (Sec. 3.1): nodes are the task's anchor states (``state_key``; ``auto`` = observation +
      ``state_extra``, the exact state string the env exposes); sinks carry the binary outcome (``z+`` = 1,
      ``z-`` = 0; ``progpo.advantages.closure``).
    * ``V`` (eqs. 5-7): ``V(u) = sum_a pi(a|u) sum_v P(v|u,a) gamma V(v)`` with the empirical frequencies,
      ``gamma = cfg.gamma``; solved exactly (one linear solve per task) where the paper runs Gauss-Seidel
      to ``1e-8``: the same fixed point, nodes that reach no success sink get 0 as there.
    * ``A_t = gamma V(s_{t+1}) - V(s_t)`` (eq. 8); Graph GAE (eqs. 9-10):
      ``A^GAE_t = A_t + sum_{k=1}^{T-t} (gamma lambda)^k Abar_{t+k}``, ``Abar_{t+k}`` = mean ``A`` over the
      distinct edges ``(u', a', v')`` whose source is reachable from the step's successor in exactly
      ``k - 1`` hops (``lambda = graft_lambda``; ``T - t`` = the steps left in the step's own trajectory).
    * Per-node normalisation (eq. 11): ``A^GAE`` standardised among the visits of the step's node
      (``gigpo_mode``, sample std + ``eps``); a node visited once gets mean 0 and std ``|A|``, i.e.
      ``A / (|A| + eps)`` (with ``mean_norm``: ``A``). The advantage is this alone (Alg. 1: no trajectory term).

    Readings where the paper leaves a choice open:

    * The sink is the state the last action leads to, merged per outcome: eq. 8 needs a successor for every
      executed transition, the batch does not carry the state a terminated episode ends in, and sinks with
      the same value have no out-edges, so merging them changes no value. A step-limit cut ends in ``z-``
      ("reached the max turns", outcome 0).
    * ``Abar`` averages each distinct edge once: averaged over edge visits it would be exactly 0 at the fixed
      point (eq. 5 makes the visit-weighted mean of ``A`` over a node's out-edges vanish), and eq. 9 would be
      eq. 8.
    * The sequence-level (geometric-mean) importance ratio of the paper's GRPO-C objective (eq. 4) is a loss
      choice, not an advantage: not part of this estimator.

    Args:
        batch: ``S`` steps. cfg: reads ``gamma, eps, gigpo_mode, state_key, graft_lambda, success_reward,
            zero_signal``. encoder: unused.
    Returns:
        ``StepAdvantages``: ``[S]`` advantages in the batch's row order; diagnostics add
        ``adv/frac_anchor_ge2`` and ``adv/closure_nodes``.
    Raises:
        ValueError: a bad batch (``StepBatch.validate``), or ``obs_inventory`` without ``state_extra``.
    """
    p = prepare(batch, cfg)
    g = closure(p, cfg.gamma)
    td = cfg.gamma * g.values[g.succ] - g.values[g.node]
    decay = cfg.gamma * cfg.graft_lambda
    gae = td + graph_gae_tail(p, g, td, decay) if decay > 0 else td
    adv, size = group_normalise(g.node, g.n, gae, cfg.gigpo_mode, cfg.eps)
    lone = gae if cfg.gigpo_mode == "mean_norm" else gae / (np.abs(gae) + cfg.eps)
    adv = np.where(size >= 2, adv, lone)
    return finish(p, adv, {"adv/frac_anchor_ge2": float(np.mean(size >= 2)), "adv/closure_nodes": float(g.n)})


def graph_gae_tail(p, g: Closure, td: np.ndarray, decay: float) -> np.ndarray:
    """``[S]`` ``sum_{k=1}^{T-t} decay^k Abar_{t+k}`` of GRAFT's eq. 9 (``decay = gamma * lambda``).

    Frontiers are (start node, reached node) pairs for every non-terminal start at once: at hop ``k`` the
    pairs hold the nodes reachable from the start in exactly ``k - 1`` hops, ``Abar_k(start)`` = sum of ``td``
    over their distinct out-edges / number of those edges (sinks have none), then the pairs step along the
    distinct node-to-node edges. Cost ``O(K * #pairs)``, ``K`` = longest trajectory.
    """
    edge, n_edges = combine(g.node, p.action_code(True), g.succ)
    rep = np.zeros(n_edges, dtype=np.int64)
    rep[edge] = np.arange(p.S)
    src, dst = g.node[rep], g.succ[rep]
    out_sum = np.bincount(src, weights=td[rep], minlength=g.n)
    out_cnt = np.bincount(src, minlength=g.n).astype(np.float64)
    inner = dst < g.n
    hop = np.unique(src[inner] * g.n + dst[inner])  # distinct u -> v among non-terminal nodes, sorted by u
    hop_u, hop_v = hop // g.n, hop % g.n
    offset = np.searchsorted(hop_u, np.arange(g.n))
    degree = np.bincount(hop_u, minlength=g.n)
    remaining = (p.traj_len[p.traj] - 1 - p.t)
    has_head = g.succ < g.n
    start = reach = np.arange(g.n)
    tail = np.zeros(p.S)
    weight = 1.0
    for k in range(1, int(remaining.max(initial=0)) + 1):
        if start.size == 0:
            break
        weight *= decay
        num = np.bincount(start, weights=out_sum[reach], minlength=g.n)
        den = np.bincount(start, weights=out_cnt[reach], minlength=g.n)
        abar = np.divide(num, den, out=np.zeros(g.n), where=den > 0)
        use = has_head & (remaining >= k)
        tail[use] += weight * abar[g.succ[use]]
        fan = degree[reach]
        total = int(fan.sum())
        within = np.arange(total) - np.repeat(np.cumsum(fan) - fan, fan)
        nxt = hop_v[np.repeat(offset[reach], fan) + within]
        pairs = np.unique(np.repeat(start, fan) * g.n + nxt)
        start, reach = pairs // g.n, pairs % g.n
    return tail
