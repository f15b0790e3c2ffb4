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
            ``z+`` and ``0`` at ``z-``.
    """

    node: np.ndarray
    succ: np.ndarray
    n: int
    values: np.ndarray

    @property
    def success_node(self) -> int:
        """Index of the absorbing success node ``z+`` in :attr:`values`."""
        return self.n


def closure(p: Prepared, discount: float) -> Closure:
    """Build the group graph and solve its fixed point ``(I - discount * M) V = b`` (CRBC eqs. 8-9).

    ``M(u, v) = N(u -> v) / N(u)`` over non-terminal ``v``, ``b(u) = discount * N(u -> z+) / N(u)``; one dense
    linear solve per task (its nodes only; ``O(n_u^3)``). ``I - discount * M`` is invertible for every
    ``discount`` in ``[0, 1]``: every visit has a successor and every trajectory ends in ``z+`` or ``z-``, so
    from every node the walk is absorbed. Nodes from which success is never reached get exactly 0 (GRAFT's
    "nodes that cannot reach a sink keep 0").

    Args:
        p: the prepared batch (its ``state_key`` picks the anchor states).
        discount: CRBC's ``beta`` / GRAFT's ``gamma``, in ``[0, 1]``.
    Returns:
        :class:`Closure`.
    """
    node, n = p.depth_keys(0)[0]
    success = trajectory_success(p)
    succ = np.empty(p.S, dtype=np.int64)
    succ[:-1] = node[1:]
    succ[p.last] = np.where(success, n, n + 1)
    visits = np.bincount(node, minlength=n).astype(np.float64)
    inner = succ < n
    values = np.zeros(n + 2)
    values[n] = 1.0
    node_task = np.zeros(n, dtype=np.int64)
    node_task[node] = p.task
    order = np.argsort(node_task, kind="stable")
    bounds = np.searchsorted(node_task[order], np.arange(p.n_tasks + 1))
    local = np.empty(n, dtype=np.int64)
    for u in range(p.n_tasks):
        ids = order[bounds[u]:bounds[u + 1]]
        local[ids] = np.arange(ids.size)
    to_success = np.bincount(node, weights=(succ == n).astype(np.float64), minlength=n) / visits
    for u in range(p.n_tasks):
        ids = order[bounds[u]:bounds[u + 1]]
        if ids.size == 0:
            continue
        rows = inner & (node_task[node] == u)
        m = np.zeros((ids.size, ids.size))
        np.add.at(m, (local[node[rows]], local[succ[rows]]), 1.0)
        m /= visits[ids][:, None]
        values[ids] = np.linalg.solve(np.eye(ids.size) - discount * m, discount * to_success[ids])
    return Closure(node=node, succ=succ, n=n, values=values)
