"""Exact advantages of a fixed history-dependent policy on a finite text MDP, by dynamic programming.

The fidelity benchmark needs the *true* step advantage ``A*(h_t, a_t) = Q(h_t, a_t) - V(h_t)`` of
the behaviour policy that generated a batch (Sutton & Barto 2018, eq. 3.12-3.13; the advantage of
Baird 1993). When the policy looks only at the current latent state ``s``, the current observation
text ``o`` and the last ``K`` actions, the pair process ``(t, node)`` with ``node = (s, o, a_{t-K..t-1})``
is Markov, so ``Q`` and ``V`` of any full history equal those of its node and time index, and
backward induction over ``t = H-1 .. 0`` gives them exactly:

    V_H(node) = 0
    Q_t(node, a) = E[r | s, a] + gamma * sum_{node'} P(node' | node, a) V_{t+1}(node')
    V_t(node) = sum_a pi(a | node) Q_t(node, a)

(terminal transitions contribute their reward and no continuation). Dimension names: ``H`` horizon
(max steps), ``Nn`` reachable nodes, ``Nsa`` reachable (node, action) pairs, ``No`` outcomes.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from progpo.envs.synthetic.mdp import Outcome, TextMDP

__all__ = ["ExactOracle", "Outcome", "SampledStep", "TextMDP"]


@dataclass
class SampledStep:
    """One step of a trajectory sampled from the oracle's graph (indices into its arrays)."""

    t: int
    node: int
    sa: int
    outcome: int


class ExactOracle:
    """Reachable-node graph of a :class:`TextMDP` with exact ``V_t`` / ``Q_t`` and trajectory sampling.

    Args:
        mdp: the MDP with its behaviour policy.
        max_nodes: safety limit on the number of reachable nodes.

    Raises:
        ValueError: an initial/policy/outcome distribution does not sum to 1 (tolerance 1e-9), a
            probability is negative, or more than ``max_nodes`` nodes are reachable.
    """

    def __init__(self, mdp: TextMDP, max_nodes: int = 2_000_000) -> None:
        self.mdp = mdp
        self.horizon = int(mdp.horizon)
        self.gamma = float(mdp.gamma)
        self.history = int(mdp.history)
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {self.horizon}")
        self._build(max_nodes)
        self._solve()

    # ---------------------------------------------------------------- graph
    def _build(self, max_nodes: int) -> None:
        mdp, k = self.mdp, self.history
        self.nodes: list[tuple[Hashable, str, tuple[str, ...]]] = []
        index: dict[tuple, int] = {}

        def node_id(state: Hashable, obs: str, hist: tuple[str, ...]) -> int:
            key = (state, obs, hist)
            got = index.get(key)
            if got is None:
                if len(self.nodes) >= max_nodes:
                    raise ValueError(f"more than max_nodes={max_nodes} reachable nodes")
                got = index[key] = len(self.nodes)
                self.nodes.append(key)
            return got

        init = mdp.initial()
        _check_probs([p for p, _, _ in init], "initial distribution")
        pad = ("",) * k
        self.init_nodes = np.array([node_id(s, o, pad) for _, s, o in init], dtype=np.int64)
        self.init_probs = np.array([p for p, _, _ in init], dtype=np.float64)

        sa_node, sa_action, sa_pi, sa_r = [], [], [], []
        out_ptr, out_prob, out_next, out_r, out_obs, out_term, out_inv = [0], [], [], [], [], [], []
        node_sa_ptr = [0]
        cursor = 0
        cached: dict[tuple, tuple] = {}
        while cursor < len(self.nodes):
            state, obs, hist = self.nodes[cursor]
            pol = mdp.policy(state, obs, hist)
            _check_probs([p for _, p in pol], f"policy at node {cursor}")
            for action, p in pol:
                cols = cached.get((state, action))
                if cols is None:
                    outs = mdp.outcomes(state, action)
                    _check_probs([o.prob for o in outs], f"outcomes of {action!r}")
                    cols = cached[(state, action)] = (
                        [o.prob for o in outs], [o.reward for o in outs], [o.obs for o in outs],
                        [o.terminated for o in outs], [o.invalid for o in outs],
                        [(o.next_state, o.obs) for o in outs],
                        sum(o.prob * o.reward for o in outs),
                    )
                new_hist = (hist + (action,))[len(hist) + 1 - k:] if k > 0 else ()
                sa_node.append(cursor)
                sa_action.append(action)
                sa_pi.append(p)
                sa_r.append(cols[6])
                out_prob.extend(cols[0])
                out_r.extend(cols[1])
                out_obs.extend(cols[2])
                out_term.extend(cols[3])
                out_inv.extend(cols[4])
                out_next.extend([-1 if term else node_id(ns, ob, new_hist)
                                 for term, (ns, ob) in zip(cols[3], cols[5])])
                out_ptr.append(len(out_prob))
            node_sa_ptr.append(len(sa_node))
            cursor += 1

        self.sa_node = np.asarray(sa_node, dtype=np.int64)
        self.sa_action = sa_action
        self.sa_pi = np.asarray(sa_pi, dtype=np.float64)
        self.sa_reward = np.asarray(sa_r, dtype=np.float64)
        self.node_sa_ptr = np.asarray(node_sa_ptr, dtype=np.int64)
        self.out_ptr = np.asarray(out_ptr, dtype=np.int64)
        self.out_prob = np.asarray(out_prob, dtype=np.float64)
        self.out_next = np.asarray(out_next, dtype=np.int64)
        self.out_reward = np.asarray(out_r, dtype=np.float64)
        self.out_obs = out_obs
        self.out_terminated = np.asarray(out_term, dtype=bool)
        self.out_invalid = np.asarray(out_inv, dtype=bool)
        self._sa_cum: dict[int, np.ndarray] = {}
        self._out_cum: dict[int, np.ndarray] = {}

    @property
    def num_nodes(self) -> int:
        """``Nn``, the number of reachable (state, observation, last-K-actions) nodes."""
        return len(self.nodes)

    @property
    def num_sa(self) -> int:
        """``Nsa``, the number of reachable (node, action) pairs."""
        return int(self.sa_node.shape[0])

    def node_index(self, state: Hashable, obs: str, hist: tuple[str, ...]) -> int:
        """Index of the node ``(state, obs, last K actions)``.

        Raises:
            ValueError: the node is not reachable.
        """
        try:
            return self.nodes.index((state, obs, tuple(hist)))
        except ValueError:
            raise ValueError(f"node {(state, obs, hist)!r} is not reachable") from None

    def sa_index(self, node: int, action: str) -> int:
        """Index of the pair ``(node, action)``.

        Raises:
            ValueError: the behaviour policy never takes ``action`` at ``node``.
        """
        for sa in range(int(self.node_sa_ptr[node]), int(self.node_sa_ptr[node + 1])):
            if self.sa_action[sa] == action:
                return sa
        raise ValueError(f"action {action!r} has probability 0 at node {node}")

    # ---------------------------------------------------------------- DP
    def _solve(self) -> None:
        n_sa, n_nodes = self.num_sa, self.num_nodes
        rows = np.repeat(np.arange(n_sa), np.diff(self.out_ptr))
        live = self.out_next >= 0
        # P: [Nsa, Nn] transition probabilities to non-terminal next nodes.
        self._p = sp.csr_matrix(
            (self.out_prob[live], (rows[live], self.out_next[live])), shape=(n_sa, n_nodes)
        )
        # Pi: [Nn, Nsa] policy weights.
        self._pi = sp.csr_matrix((self.sa_pi, (self.sa_node, np.arange(n_sa))), shape=(n_nodes, n_sa))
        v = np.zeros((self.horizon + 1, n_nodes), dtype=np.float64)  # V_t, [H+1, Nn]
        for t in range(self.horizon - 1, -1, -1):
            q_t = self.sa_reward + self.gamma * (self._p @ v[t + 1])
            v[t] = self._pi @ q_t
        self.values = v

    def value(self, t: int, node: int) -> float:
        """``V_t(node)``: expected discounted return-to-go from step ``t`` (0-based) at ``node``."""
        return float(self.values[t, node])

    def q_value(self, t: int, sa: int) -> float:
        """``Q_t(node, a)`` for the (node, action) pair index ``sa`` at step ``t``."""
        a, b = self.out_ptr[sa], self.out_ptr[sa + 1]
        nxt = self.out_next[a:b]
        cont = np.where(nxt >= 0, self.values[t + 1, np.maximum(nxt, 0)], 0.0)
        return float(self.sa_reward[sa] + self.gamma * np.dot(self.out_prob[a:b], cont))

    def advantage(self, t: int, sa: int) -> float:
        """True advantage ``A*_t = Q_t(node, a) - V_t(node)`` of pair ``sa`` at step ``t``."""
        return self.q_value(t, sa) - self.value(t, int(self.sa_node[sa]))

    def start_value(self) -> float:
        """Expected discounted return of the behaviour policy from the initial distribution."""
        return float(np.dot(self.init_probs, self.values[0, self.init_nodes]))

    # ---------------------------------------------------------------- sampling
    def sample(self, rng: np.random.Generator) -> list[SampledStep]:
        """Sample one trajectory of the behaviour policy (at most ``H`` steps)."""
        steps: list[SampledStep] = []
        node = int(self.init_nodes[_pick(np.cumsum(self.init_probs), rng)])
        for t in range(self.horizon):
            lo = int(self.node_sa_ptr[node])
            cum = self._sa_cum.get(node)
            if cum is None:
                cum = self._sa_cum[node] = np.cumsum(self.sa_pi[lo:self.node_sa_ptr[node + 1]])
            sa = lo + _pick(cum, rng)
            lo = int(self.out_ptr[sa])
            cum = self._out_cum.get(sa)
            if cum is None:
                cum = self._out_cum[sa] = np.cumsum(self.out_prob[lo:self.out_ptr[sa + 1]])
            out = lo + _pick(cum, rng)
            steps.append(SampledStep(t=t, node=node, sa=sa, outcome=out))
            if self.out_terminated[out]:
                break
            node = int(self.out_next[out])
        return steps


def _pick(cum: np.ndarray, rng: np.random.Generator) -> int:
    return int(min(np.searchsorted(cum, rng.random() * cum[-1], side="right"), len(cum) - 1))


def _check_probs(probs: list[float], what: str) -> None:
    if not probs:
        raise ValueError(f"{what} is empty")
    if min(probs) < 0:
        raise ValueError(f"{what} has a negative probability")
    total = float(sum(probs))
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"{what} sums to {total}, expected 1")
