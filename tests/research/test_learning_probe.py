"""The learning probe: exact advantages of the learner's policy, and the aliasing finding it documents."""

import numpy as np

from progpo.advantages import AdvantageConfig, compute_advantages
from research.learning_probe import E12, LearnerMDP, LogLinearPolicy, Probe, main
from research.oracle import ExactOracle


def test_learner_mdp_uses_the_learners_policy():
    probe = Probe()
    task, pol = probe.tasks[0], LogLinearPolicy()
    uid = f"task{task.seed}"
    _, state, obs = task.initial()[0]
    acts = task.admissible(state)
    pol.theta_obs[(uid, obs, acts[0])] = 2.0
    got = dict(LearnerMDP(task, pol).policy(state, obs, ()))
    assert np.allclose([got[a] for a in acts], pol.probs(uid, obs, acts))
    assert got[acts[0]] > got[acts[1]]
    assert ExactOracle(LearnerMDP(task, pol)).start_value() > 0


def test_take_credit_needs_inventory_keys():
    """Observation keys alias holding / not holding: 'take' gets ~0 E2 credit; E3 keys restore it."""
    probe, pol = Probe(), LogLinearPolicy()
    batch, recs, wins, states = probe.batch(pol, np.random.default_rng([0, 4242]))
    astar, _ = probe.exact(pol, batch, recs, states)
    take = np.array([acts[k].startswith("take") for (_, _, acts, _, k) in recs])
    assert take.sum() > 10 and astar[take].mean() > 0.5
    credit = {sk: compute_advantages(batch, AdvantageConfig(**probe.base, **E12, beta_episode=0.0,
                                                            state_key=sk)).advantages[take].mean()
              for sk in ("obs", "obs_inventory")}
    assert credit["obs_inventory"] > 0.5
    assert abs(credit["obs"]) < 0.25


def test_main_train_prints_table(capsys):
    assert main(["--mode", "train", "--train.num_iterations", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 0 |" in out and "state_key=obs" in out
