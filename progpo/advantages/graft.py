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
      ``gamma = graft_gamma``; solved exactly (one linear solve per task) where the paper runs Gauss-Seidel
      to ``1e-8``: the same fixed point, nodes that reach no success sink get 0 as there.
    * ``A_t = gamma V(s_{t+1}) - V(s_t)`` (eq. 8); Graph GAE (eqs. 9-10):
      ``A^GAE_t = A_t + sum_{k=1}^{T-t} (gamma lambda)^k Abar_{t+k}``, ``Abar_{t+k}`` = mean ``A`` over the
      distinct edges ``(u', a', v')`` whose source is reachable from the step's successor in exactly
      ``k - 1`` hops (``lambda = graft_lambda``; ``T - t`` = the steps left in the step's own trajectory).
    * Per-node normalisation (eq. 11): ``A^GAE`` standardised among the visits of the step's node
      (``gigpo_mode``, sample std + ``eps``); a node with only one out-edge (one distinct ``(a, v)``, however
      often taken) gets mean 0 and std ``|A|``, i.e. ``A / (|A| + eps)`` per visit (with ``mean_norm``: ``A``).
      The advantage is this alone (Alg. 1: no trajectory term).

    Readings where the paper leaves a choice open:

    * The sink is the state the last action leads to, merged per outcome: eq. 8 needs a successor for every
      executed transition, the batch does not carry the state a terminated episode ends in, and sinks with
      the same value have no out-edges, so merging them changes no value. A step-limit cut ends in ``z-``
      ("reached the max turns", outcome 0).
    * Eq. 11's group is the node's visits (the "actions sampled from the same state"), and its one-edge rule
      applies to a node whose visits all took the same edge: standardising those would turn the GAE tails'
      small differences (visits with different steps left) into unit-scale credit, or give exactly 0.
    * ``Abar`` averages each distinct edge once: averaged over edge visits it would be exactly 0 at the fixed
      point (eq. 5 makes the visit-weighted mean of ``A`` over a node's out-edges vanish), and eq. 9 would be
      eq. 8.
    * The sequence-level (geometric-mean) importance ratio of the paper's GRPO-C objective (eq. 4) is a loss
      choice, not an advantage: not part of this estimator.

    Args:
        batch: ``S`` steps. cfg: reads ``graft_gamma, eps, gigpo_mode, state_key, graft_lambda, success_reward,
            zero_signal``. encoder: unused.
    Returns:
        ``StepAdvantages``: ``[S]`` advantages in the batch's row order; diagnostics add
        ``adv/frac_anchor_ge2`` and ``adv/closure_nodes``.
    Raises:
        ValueError: a bad batch (``StepBatch.validate``), or ``obs_inventory`` without ``state_extra``.
    """
    p = prepare(batch, cfg)
    g = closure(p, cfg.graft_gamma)
    td = cfg.graft_gamma * g.values[g.succ] - g.values[g.node]
    decay = cfg.graft_gamma * cfg.graft_lambda
    gae = td + graph_gae_tail(p, g, td, decay) if decay > 0 else td
    adv, size = group_normalise(g.node, g.n, gae, cfg.gigpo_mode, cfg.eps)
    edge, _ = combine(g.node, p.action_code(True), g.succ)
    edges_out = np.bincount(g.node[np.unique(edge, return_index=True)[1]], minlength=g.n)
    lone = gae if cfg.gigpo_mode == "mean_norm" else gae / (np.abs(gae) + cfg.eps)
    adv = np.where(edges_out[g.node] >= 2, adv, lone)
    return finish(p, adv, {"adv/frac_anchor_ge2": float(np.mean(size >= 2)), "adv/closure_nodes": float(g.n)})


def graph_gae_tail(p, g: Closure, td: np.ndarray, decay: float) -> np.ndarray:
    """``[S]`` ``sum_{k=1}^{T-t} decay^k Abar_{t+k}`` of GRAFT's eq. 9 (``decay = gamma * lambda``).

    Per task, a boolean matrix ``R`` (one row per start node) holds the nodes reachable from the start in
    exactly ``k - 1`` hops; ``Abar_k(start) = R . out_sum / R . out_cnt`` (the sum of ``td`` over the distinct
    out-edges of those nodes over their number; sinks have none), then ``R`` steps along the distinct
    node-to-node edges (a column-wise OR, ``np.logical_or.reduceat``; no BLAS). A start stays only while some
    step still needs its hop. Cost ``O(K * sum_u n_u * (n_u + e_u))``, ``K`` = longest trajectory, ``n_u`` /
    ``e_u`` = nodes / distinct edges of task ``u``.
    """
    edge, n_edges = combine(g.node, p.action_code(True), g.succ)
    rep = np.zeros(n_edges, dtype=np.int64)
    rep[edge] = np.arange(p.S)
    src, dst = g.node[rep], g.succ[rep]
    out_sum = np.bincount(src, weights=td[rep], minlength=g.n)
    out_cnt = np.bincount(src, minlength=g.n).astype(np.float64)
    inner = dst < g.n
    remaining = p.traj_len[p.traj] - 1 - p.t
    has_head = g.succ < g.n
    need = np.zeros(g.n, dtype=np.int64)  # most hops any step whose successor is this node still needs
    np.maximum.at(need, g.succ[has_head], remaining[has_head])
    hops = int(need.max(initial=0))
    abar = np.zeros((g.n, hops + 1))  # abar[v, k]: Abar_k from successor node v
    node_task = np.zeros(g.n, dtype=np.int64)
    node_task[g.node] = p.task
    local = np.zeros(g.n, dtype=np.int64)
    for u in range(p.n_tasks):
        ids = np.flatnonzero(node_task == u)
        local[ids] = np.arange(ids.size)
        here = inner & (node_task[src] == u)
        by_dst = np.argsort(local[dst[here]], kind="stable")
        e_src, e_dst = local[src[here]][by_dst], local[dst[here]][by_dst]
        heads, cuts = np.unique(e_dst, return_index=True)
        starts = ids[need[ids] >= 1]
        reach = np.zeros((starts.size, ids.size), dtype=bool)
        reach[np.arange(starts.size), local[starts]] = True
        for k in range(1, hops + 1):
            den = np.sum(reach * out_cnt[ids], axis=1)
            num = np.sum(reach * out_sum[ids], axis=1)
            abar[starts, k] = np.divide(num, den, out=np.zeros(starts.size), where=den > 0)
            keep = need[starts] > k  # starts still needed at hop k + 1
            starts, reach = starts[keep], reach[keep]
            if starts.size == 0 or heads.size == 0:
                break
            step = np.zeros_like(reach)  # along the distinct edges: OR of the sources of each head
            step[:, heads] = np.logical_or.reduceat(reach[:, e_src], cuts, axis=1)
            reach = step
    k = np.arange(hops + 1)
    weights = np.where(k[None, :] <= remaining[:, None], decay ** k, 0.0)
    weights[:, 0] = 0.0
    return np.where(has_head, np.sum(abar[np.minimum(g.succ, g.n - 1)] * weights, axis=1), 0.0)
