"""The merged graph of a group's rollouts with absorbing success / failure nodes, and its value fixed point.

Shared by CRBC (arXiv 2609.35082, eqs. 1, 5, 8-9) and GRAFT (arXiv 2609.28963, eqs. 5-7): per task, the
anchor states of its steps (``state_key``) are the non-terminal nodes; a step goes from its anchor state to
the next step's anchor state, and a trajectory's last step goes to one of two absorbing nodes, success
``z+`` (value 1) or failure ``z-`` (value 0). ``V`` solves ``V(u) = gamma * sum_v N(u -> v) / N(u) * V(v)``:
the behaviour policy's visit frequencies times the observed transition frequencies (CRBC eq. 5, GRAFT eq. 6)
collapse to the frequency of the edge ``u -> v`` among the visits of ``u``. Dimension names: ``S`` steps,
``M`` trajectories, ``n`` non-terminal nodes (all tasks; ids are task-specific), ``U`` tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from progpo.advantages._prep import Prepared

#: Relative tolerance of the success test (``r_last >= success_reward``): a success reward that went
#: through float arithmetic (``score * success_reward`` with score 1) still counts.
SUCCESS_RTOL = 1e-9


def trajectory_success(p: Prepared) -> np.ndarray:
    """``[M]`` bool: the trajectory ended in success, its binary outcome ``R_i`` (CRBC eq. 1, GRAFT Sec. 3.1).

    Success = its last step ``terminated`` with a reward ``>= success_reward`` (reward units, 10 in every env
    here: ALFWorld's win, WebShop's purchase with score 1). A terminated step with less (a failure, a WebShop
    purchase with a partial score) and a step-limit cut (``truncated``, or no flag) are failures: CRBC counts a
    time-limit cut as failure (Sec. 3), GRAFT values a trajectory cut at the max turns by its outcome 0.
    """
    r_last = p.r[p.last]
    return p.ended_done[p.last] & (r_last >= p.cfg.success_reward * (1.0 - SUCCESS_RTOL))


@dataclass(frozen=True)
class Closure:
    """The merged graph of a batch and its fixed-point values (all arrays in ``Prepared``'s sorted row order).

    Attributes:
        node: ``[S]`` the step's non-terminal node, ``0..n-1``.
        succ: ``[S]`` the node the step goes to: the next step's node, or ``n`` (``z+``) / ``n + 1`` (``z-``)
            on a trajectory's last step.
        n: number of non-terminal nodes.
        values: ``[n + 2]`` the fixed point ``V`` (unitless, a discounted success probability), ``1`` at
            ``z+`` and ``0`` at ``z-``; with ``reward``: expected discounted returns (reward units), 0 at both.
    """

    node: np.ndarray
    succ: np.ndarray
    n: int
    values: np.ndarray

    @property
    def success_node(self) -> int:
        """Index of the absorbing success node ``z+`` in :attr:`values`."""
        return self.n


#: Value iteration stops when no value moved by more than this: a few float ulps of a probability in [0, 1]
#: (a looser stop, 1e-13, left errors that the per-node standardisation of near-equal credits magnified to 1e-7).
TOLERANCE = 1e-15
#: Most sweeps of the value iteration (never reached on rollout graphs; a bound, not a setting).
MAX_SWEEPS = 1_000_000


def closure(p: Prepared, discount: float, reward: np.ndarray | None = None) -> Closure:
    """Build the group graph and find its fixed point ``V = discount * (M V + m_+)`` (CRBC eqs. 8-9, GRAFT eq. 5).

    ``M(u, v) = N(u -> v) / N(u)`` over non-terminal ``v`` and ``m_+(u) = N(u -> z+) / N(u)``. With ``reward``
    (``[S]``, reward units, sorted rows) the same closure carries the observed rewards instead of the binary
    outcome: ``V = rbar + discount * M V``, ``rbar(u)`` the mean reward of ``u``'s visits, and both absorbing
    nodes worth 0 (``values[n] = 0``); on rewards that are ``c`` on a successful last step and 0 elsewhere it is
    ``c * V_binary / discount``. The fixed point
    is unique for every ``discount`` in ``[0, 1]``: every visit has a successor and every trajectory ends in
    ``z+`` or ``z-``, so from every node the walk is absorbed (``I - discount M`` is invertible). Nodes from
    which success is never reached get exactly 0 (GRAFT's "nodes that cannot reach a sink keep 0").

    Solved by Jacobi value iteration over every task at once (edges as index arrays + ``np.bincount``), each
    node's self-loop solved in closed form, ``V(u) = discount (sum_{v != u} M(u,v) V(v) + m_+(u)) /
    (1 - discount M(u,u))``, from ``V = 0`` until no value moves by more than :data:`TOLERANCE`: on a
    trajectory graph, a DAG apart from revisits, that takes about the longest trajectory's length in sweeps.
    CRBC solves the same system with one dense linear solve, GRAFT iterates Gauss-Seidel to ``1e-8``; the
    iteration is far cheaper here than a dense solve per task (timings: docs/estimators.md, "Speed").
    Cost ``O(sweeps * #edges)``.

    Args:
        p: the prepared batch (its ``state_key`` picks the anchor states).
        discount: CRBC's ``beta`` / GRAFT's ``gamma``, in ``[0, 1]``.
        reward: None (the binary outcome, CRBC / GRAFT) or ``[S]`` step rewards (ProGPO's closure potentials).
    Returns:
        :class:`Closure`.
    """
    node, n = p.depth_keys(0)[0]
    success = trajectory_success(p)
    succ = np.empty(p.S, dtype=np.int64)
    succ[:-1] = node[1:]
    succ[p.last] = np.where(success, n, n + 1)
    visits = np.bincount(node, minlength=n).astype(np.float64)
    to_success = np.bincount(node, weights=(succ == n).astype(np.float64), minlength=n) / visits
    stay = np.bincount(node, weights=(succ == node).astype(np.float64), minlength=n) / visits
    move = (succ < n) & (succ != node)
    edge = np.unique(node[move] * n + succ[move])  # distinct u -> v, u != v, both non-terminal
    e_src, e_dst = edge // n, edge % n
    e_prob = np.bincount(np.searchsorted(edge, node[move] * n + succ[move]), minlength=edge.size) / visits[e_src]
    scale = discount / (1.0 - discount * stay)  # stay < 1: a trajectory's last visit of u leaves u
    values = np.zeros(n + 2)
    lead = 0.0  # the rewards' share: rbar(u) / (1 - discount M(u, u))
    if reward is None:
        values[n] = 1.0
    else:
        lead = np.bincount(node, weights=reward, minlength=n) / visits / (1.0 - discount * stay)
        to_success = 0.0
    v = np.zeros(n)
    for _ in range(MAX_SWEEPS):
        new = scale * (np.bincount(e_src, weights=e_prob * v[e_dst], minlength=n) + to_success) + lead
        moved = float(np.max(np.abs(new - v), initial=0.0))
        v = new
        if moved <= TOLERANCE * max(1.0, float(np.max(np.abs(v), initial=0.0))):  # relative above 1 (rewards)
            break
    values[:n] = v
    return Closure(node=node, succ=succ, n=n, values=values)
