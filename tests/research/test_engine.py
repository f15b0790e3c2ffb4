"""The vectorised learner engine against the reference loop (exact values, policy gradient) and Monte Carlo."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from research import engine
from progpo.envs.synthetic.families import FAMILIES, make_tasks
from research.learning_probe import LEARN_CFG, LearnerMDP, LogLinearPolicy
from research.oracle import ExactOracle
from progpo.envs.synthetic.alfworld_like import make_tasks as alf_tasks


def _tabular(n_tasks=3, seed=1):
    tasks = alf_tasks(LEARN_CFG, n_tasks, seed)
    cts = [engine.compile_task(t, keep_states=True) for t in tasks]
    g, n_params = engine.tabular_graph(cts)
    return tasks, cts, g, n_params


def _as_dict_policy(cts, theta) -> LogLinearPolicy:
    """The reference policy with the same parameters as the engine's tabular vector ``theta``."""
    pol, off = LogLinearPolicy(), 0
    for ct in cts:
        for s in range(ct.sa_node.shape[0]):
            obs, act = ct.obs_text[ct.node_obs[ct.sa_node[s]]], ct.act_text[ct.sa_act[s]]
            pol.theta_obs[(ct.uid, obs, act)] = theta[off + ct.sa_pair[s]]
        for k, act in enumerate(ct.act_text):
            pol.theta_act[(ct.uid, act)] = theta[off + ct.n_pairs + k]
        off += ct.n_pairs + ct.act_text.shape[0]
    return pol


def test_exact_values_equal_the_reference_oracle_of_the_learner():
    tasks, cts, g, n_params = _tabular()
    theta = np.random.default_rng(0).normal(0, 1.5, n_params)
    p = engine.policy_probs(g, theta)
    q, v = engine.exact_values(g, p)
    pol = _as_dict_policy(cts, theta)
    node0 = 0
    for k, (task, ct) in enumerate(zip(tasks, cts)):
        orc = ExactOracle(LearnerMDP(task, pol))
        idx = {key: i for i, key in enumerate(orc.nodes)}
        lo, hi = g.init_ptr[k], g.init_ptr[k + 1]
        assert np.dot(g.init_prob[lo:hi], v[0, g.init_node[lo:hi]]) == pytest.approx(orc.start_value(), abs=1e-10)
        for n in range(0, ct.num_nodes, 5):
            on = idx[(ct.node_state[n], ct.obs_text[ct.node_obs[n]], ())]
            for sa in range(ct.node_sa_ptr[n], ct.node_sa_ptr[n + 1]):
                ref = orc.sa_index(on, ct.act_text[ct.sa_act[sa]])
                for t in (0, 7, 29):
                    assert q[t, g.node_sa_ptr[node0 + n] + sa - ct.node_sa_ptr[n]] == pytest.approx(
                        orc.q_value(t, ref), abs=1e-10)
        node0 += ct.num_nodes


def test_policy_gradient_equals_the_reference_update():
    _, cts, g, n_params = _tabular()
    rng = np.random.default_rng(1)
    theta = rng.normal(0, 1.0, n_params)
    p = engine.policy_probs(g, theta)
    roll = engine.rollout(g, p, 4, rng, history=2)
    roll.batch.validate()
    adv = rng.normal(size=roll.env_steps)
    grad = engine.policy_gradient(g, p, roll, adv, n_params)
    pol = _as_dict_policy(cts, theta)
    after = copy.deepcopy(pol)
    recs = []
    for i in range(roll.env_steps):
        n = roll.node[i]
        lo, hi = g.node_sa_ptr[n], g.node_sa_ptr[n + 1]
        acts = [g.act_text[g.sa_act[s]] for s in range(lo, hi)]
        assert np.allclose(p[lo:hi], pol.probs(cts[g.node_task[n]].uid, g.obs_text[g.node_obs[n]], acts))
        recs.append((cts[g.node_task[n]].uid, g.obs_text[g.node_obs[n]], acts, p[lo:hi], roll.sa[i] - lo, adv[i]))
    after.update(recs, lr=1.0, n_traj=1)
    off = 0
    for ct in cts:
        for s in range(ct.sa_node.shape[0]):
            key = (ct.uid, ct.obs_text[ct.node_obs[ct.sa_node[s]]], ct.act_text[ct.sa_act[s]])
            assert after.theta_obs[key] - pol.theta_obs[key] == pytest.approx(grad[off + ct.sa_pair[s]], abs=1e-12)
        off += ct.n_pairs + ct.act_text.shape[0]


@pytest.mark.parametrize("family", ["alfworld", "webshop"])
def test_rollout_returns_match_the_exact_start_value(family):
    fam = FAMILIES[family]
    cts = [engine.compile_task(t, features=fam.features) for t in make_tasks(fam, fam.learn_cfg, 2, 3)]
    index = engine.FeatureIndex()
    g = engine.feature_graph(cts, index)
    rng = np.random.default_rng(2)
    theta = rng.normal(0, 1.0, len(index))
    theta[0] = 0.0
    p = engine.policy_probs(g, theta)
    _, v = engine.exact_values(g, p)
    start = np.add.reduceat(g.init_prob * v[0, g.init_node], g.init_ptr[:-1])
    roll = engine.rollout(g, p, 3000, rng, history=2)
    b = roll.batch
    disc = b.reward * g.gamma ** b.step_index
    ret = np.bincount(b.traj_id, disc).reshape(len(cts), -1)
    se = ret.std(axis=1) / np.sqrt(ret.shape[1])
    assert np.all(np.abs(ret.mean(axis=1) - start) < 5 * se + 1e-9)
    # exact advantages average to zero under the policy at every visited node and step
    astar, _ = engine.exact_advantages(g, p, roll)
    q, v = engine.exact_values(g, p)
    n, t = roll.node[0], 0
    lo, hi = g.node_sa_ptr[n], g.node_sa_ptr[n + 1]
    assert np.dot(p[lo:hi], q[t, lo:hi] - v[t, n]) == pytest.approx(0.0, abs=1e-9)
    assert astar.shape == (roll.env_steps,)


def test_feature_padding_parameter_never_moves():
    fam = FAMILIES["alfworld"]
    cts = [engine.compile_task(t, features=fam.features) for t in make_tasks(fam, fam.learn_cfg, 2, 3)]
    index = engine.FeatureIndex()
    g = engine.feature_graph(cts, index)
    p = engine.policy_probs(g, np.zeros(len(index)))
    roll = engine.rollout(g, p, 4, np.random.default_rng(0), history=2)
    grad = engine.policy_gradient(g, p, roll, np.ones(roll.env_steps), len(index))
    assert grad[0] == 0.0 and np.abs(grad).sum() > 0
