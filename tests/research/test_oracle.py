"""The exact oracle against values solved by hand, and against Monte Carlo on a generated task."""

from __future__ import annotations

import numpy as np
import pytest

from research.oracle import ExactOracle, Outcome
from progpo.envs.synthetic.alfworld_like import MDPConfig, SyntheticTask


class HandMDP:
    """Two states A -> B, horizon 2, gamma 0.5, a policy at B that depends on the previous action.

    A: x -> B (r 0); y -> B (r 1) or terminal (r 0) with prob 1/2 each.
    B: x -> terminal success (r 10); y -> B (r 0).
    pi(A) = (x 1/2, y 1/2); pi(B | last x) = (x 1/4, y 3/4); pi(B | last y) = (x 3/4, y 1/4).
    """

    horizon, gamma, history = 2, 0.5, 1

    def initial(self):
        return [(1.0, "A", "at A")]

    def policy(self, state, obs, hist):
        if state == "A":
            return [("x", 0.5), ("y", 0.5)]
        return [("x", 0.25), ("y", 0.75)] if hist == ("x",) else [("x", 0.75), ("y", 0.25)]

    def outcomes(self, state, action):
        if state == "A" and action == "x":
            return [Outcome(1.0, "B", "at B", 0.0, False, False)]
        if state == "A":
            return [Outcome(0.5, "B", "at B", 1.0, False, False), Outcome(0.5, None, "end", 0.0, True, False)]
        if action == "x":
            return [Outcome(1.0, None, "won", 10.0, True, False)]
        return [Outcome(1.0, "B", "at B", 0.0, False, False)]


def test_hand_solved_values_and_advantages():
    # By hand: V_2 = 0.  t=1: Q(B,x) = 10, Q(B,y) = 0 (truncated after it);
    # V_1(B | last x) = 0.25*10 = 2.5, V_1(B | last y) = 0.75*10 = 7.5.
    # t=0: Q(A,x) = 0.5*2.5 = 1.25; Q(A,y) = 0.5*(1 + 0.5*7.5) + 0.5*0 = 2.375; V_0 = 1.8125.
    orc = ExactOracle(HandMDP())
    a = orc.node_index("A", "at A", ("",))
    bx = orc.node_index("B", "at B", ("x",))
    by = orc.node_index("B", "at B", ("y",))
    assert orc.num_nodes == 3
    assert orc.value(0, a) == pytest.approx(1.8125)
    assert orc.start_value() == pytest.approx(1.8125)
    assert orc.value(1, bx) == pytest.approx(2.5)
    assert orc.value(1, by) == pytest.approx(7.5)
    assert orc.q_value(0, orc.sa_index(a, "x")) == pytest.approx(1.25)
    assert orc.q_value(0, orc.sa_index(a, "y")) == pytest.approx(2.375)
    assert orc.advantage(0, orc.sa_index(a, "x")) == pytest.approx(-0.5625)
    assert orc.advantage(0, orc.sa_index(a, "y")) == pytest.approx(0.5625)
    assert orc.advantage(1, orc.sa_index(bx, "x")) == pytest.approx(7.5)
    assert orc.advantage(1, orc.sa_index(bx, "y")) == pytest.approx(-2.5)
    assert orc.advantage(1, orc.sa_index(by, "x")) == pytest.approx(2.5)
    assert orc.advantage(1, orc.sa_index(by, "y")) == pytest.approx(-7.5)
    # Horizon 1: only the immediate rewards count.  Q(A,x) = 0, Q(A,y) = 0.5, V_0 = 0.25.
    one = HandMDP()
    one.horizon = 1
    assert ExactOracle(one).start_value() == pytest.approx(0.25)


def test_bad_distribution_is_rejected():
    class Bad(HandMDP):
        def policy(self, state, obs, hist):
            return [("x", 0.5), ("y", 0.4)]

    with pytest.raises(ValueError, match="sums to"):
        ExactOracle(Bad())


def test_generated_task_matches_monte_carlo():
    cfg = MDPConfig(n_locations=4, horizon=8, n_variants=2)
    task = SyntheticTask(cfg, seed=3)
    orc = ExactOracle(task)
    rng = np.random.default_rng(0)
    returns = []
    for _ in range(4000):
        steps = orc.sample(rng)
        returns.append(sum(cfg.gamma ** s.t * orc.out_reward[s.outcome] for s in steps))
    se = np.std(returns) / np.sqrt(len(returns))
    assert abs(np.mean(returns) - orc.start_value()) < 5 * se + 1e-9
    # The advantage of the behaviour policy averages to 0 at every node (sum_a pi Q = V).
    for node in range(0, orc.num_nodes, 37):
        lo, hi = orc.node_sa_ptr[node], orc.node_sa_ptr[node + 1]
        avg = sum(orc.sa_pi[sa] * orc.advantage(2, sa) for sa in range(lo, hi))
        assert avg == pytest.approx(0.0, abs=1e-9)
