"""Extensions E1 (``potential_estimator='graph'``) and E2 (``credit='action'``) of the spec.

Per task, the batch is an empirical MDP over depth-0 nodes (anchor states, ``state_key``; merged by
semantic similarity ``>= tau`` when an encoder is given): visit counts ``n(o,a)``, mean reward
``rbar(o,a)``, behaviour ``pi0(a|o) = n(o,a)/n(o)``, transitions ``T(o'|o,a)``. Backward induction
over the horizon ``H = max_steps``: ``V_H = 0``, ``Q_t = rbar + gamma T V_{t+1}``, ``V_t = pi0 Q_t``.
All tasks are solved at once (node ids are task-specific), edges as index arrays + ``np.bincount``:
cost ``O(H * (#edges + #pairs))``.

Outcome of a trajectory's last step: ``terminated`` -> value 0 (counted in T's denominator, no edge).
Truncated (or unflagged) last steps go to the node of their final observation (``StepBatch.final_obs``;
with ``obs_inventory`` the last step's inventory is assumed unchanged), placed as any anchor observation
is: without an encoder, the state with the same text in the task; with one, by the same semantic merging
(``merge_nodes``); a final observation that joins no anchor state goes to a node without data, value 0. Without
``final_obs`` the outcome is unknown and those steps are left out of ``T`` (``rbar``, ``n`` and ``pi0``
still count them); a pair seen only there gets ``Q = rbar``. Invalid actions share one action symbol.
"""

from __future__ import annotations

import time

import numpy as np

from progpo.advantages._prep import Prepared, combine
from progpo.advantages.semantic import Encoder, merge_nodes


def solve_graph(p: Prepared, encoder: Encoder | None, timings: dict | None = None):
    """Build the empirical MDP and run backward induction.

    Returns:
        dict with node ``[S]``, pair ``[S]``, V ``[H+1, n_nodes]``, Q ``[H, n_pairs]``,
        single_action ``[S]`` bool (the step's node only ever took one action), merged ``[S]`` bool.
    Raises:
        ValueError: a trajectory longer than ``max_steps`` (names the field).
    """
    cfg = p.cfg
    H = cfg.max_steps
    longest = int(p.traj_len.max())
    if longest > H:
        raise ValueError(
            f"AdvantageConfig.max_steps={H} but the batch has a trajectory of {longest} steps; "
            "set max_steps to the env's step limit"
        )
    cut = np.flatnonzero(p.last & ~p.ended_done) if p.batch.final_obs is not None else None
    if encoder is not None:
        t0 = time.perf_counter()
        node, merged, fin = merge_nodes(p, encoder, cut)
        if timings is not None:
            timings["embeddings"] = timings.get("embeddings", 0.0) + (time.perf_counter() - t0) * 1e3
    else:
        node, _ = combine(p.depth_keys(0)[0][0])
        merged = np.zeros(p.S, dtype=bool)
        fin = None if cut is None else _final_nodes(p, node, cut)
    n_nodes = int(node.max()) + 1
    pair, n_pairs = combine(node, p.action_code(True))
    pair_node = np.zeros(n_pairs, dtype=np.int64)
    pair_node[pair] = node
    n_pair = np.bincount(pair, minlength=n_pairs).astype(np.float64)
    n_node = np.bincount(node, minlength=n_nodes).astype(np.float64)
    rbar = np.bincount(pair, weights=p.r, minlength=n_pairs) / n_pair
    pi0 = n_pair / n_node[pair_node]
    known = ~p.last | p.ended_done  # outcome known: a next step, or done (value 0)
    src = np.flatnonzero(~p.last)
    dst = node[src + 1]
    if cut is not None:
        known = known | (p.last & ~p.ended_done)
        hit = fin >= 0  # a final observation never seen as an anchor: value-0 node, no edge
        src, dst = np.r_[src, cut[hit]], np.r_[dst, fin[hit]]
    n_known = np.bincount(pair, weights=known.astype(np.float64), minlength=n_pairs)
    edge, n_edges = combine(pair[src], dst)
    e_pair = np.zeros(n_edges, dtype=np.int64)
    e_dst = np.zeros(n_edges, dtype=np.int64)
    e_pair[edge] = pair[src]
    e_dst[edge] = dst
    e_prob = np.bincount(edge, minlength=n_edges) / n_known[e_pair]
    V = np.zeros((H + 1, n_nodes))
    Q = np.zeros((H, n_pairs))
    for t in range(H - 1, -1, -1):
        Q[t] = rbar + cfg.gamma * np.bincount(e_pair, weights=e_prob * V[t + 1, e_dst], minlength=n_pairs)
        V[t] = np.bincount(pair_node, weights=pi0 * Q[t], minlength=n_nodes)
    n_actions = np.bincount(pair_node, minlength=n_nodes)
    return {"node": node, "pair": pair, "V": V, "Q": Q, "single_action": n_actions[node] == 1, "merged": merged}


def _final_nodes(p: Prepared, node: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """Without an encoder: node of each truncated last step's final observation (exact state match in its
    task), or -1. With one, ``merge_nodes`` places final observations by the same semantic merging."""
    obs = p.batch.anchor_obs[p.order]
    extra = p.batch.state_extra[p.order] if p.cfg.state_key == "obs_inventory" else np.full(p.S, "", dtype=object)
    lookup = dict(zip(zip(p.task.tolist(), obs.tolist(), extra.tolist()), node.tolist()))
    fin = p.batch.final_obs[p.order]
    return np.array([lookup.get((p.task[r], fin[r], extra[r]), -1) for r in cut.tolist()], dtype=np.int64)


def graph_credit(p: Prepared, encoder: Encoder | None, timings: dict | None = None):
    """E1/E2 credit per step: transition ``r + gamma V_{t+1}(o') - V_t(o)`` (Phi = 0 after the last step)
    or action ``Q_t(o,a) - V_t(o)`` (exactly 0 where the node only ever took one action).

    Returns (C ``[S]``, diagnostics).
    """
    emb_before = 0.0 if timings is None else timings.get("embeddings", 0.0)
    t0 = time.perf_counter()
    g = solve_graph(p, encoder, timings)
    t = p.t
    phi = g["V"][t, g["node"]]
    if p.cfg.credit == "action":
        credit = g["Q"][t, g["pair"]] - phi
        credit = np.where(g["single_action"], 0.0, credit)
    else:
        nxt = np.zeros(p.S)
        nxt[:-1] = phi[1:]
        nxt[p.last] = 0.0
        credit = (p.r + p.cfg.gamma * nxt) - phi
    if timings is not None:
        emb = timings.get("embeddings", 0.0) - emb_before
        timings["potentials"] = timings.get("potentials", 0.0) + (time.perf_counter() - t0) * 1e3 - emb
    diag = {
        "adv/graph_nodes": float(int(g["node"].max()) + 1),
        "adv/frac_semantic_expansion": float(np.mean(g["merged"])),
        "adv/frac_single_action_node": float(np.mean(g["single_action"])),
    }
    return credit, diag
