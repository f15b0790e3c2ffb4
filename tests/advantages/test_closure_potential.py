"""ProGPO with ``potential_target='closure'``: the potential of an anchor state is the closure value of the task's
merged graph (CRBC arXiv 2609.35082, eqs. 8-9; GRAFT arXiv 2609.28963, eq. 5), not the visit average of its
returns (CRBC's eq. 6, the K = 0 member of its eq. 10).

One task, four rollouts, anchor states ``s`` (start), ``k`` (a detour, one rollout) and ``m`` (shared by all
four); success reward 10, gamma 0.95:

* t1: s -a-> k -c-> m -e-> success (r = 10 on the last step)
* t2: s -b-> m -f-> failure (terminated, r = 0)
* t3: s -b-> m -e-> success (r = 10)
* t4: s -b-> m -x-> cut by the step limit, x an invalid action (r = -0.1)

Every expected number is derived in the comments by hand; the estimator is never called to produce one.
"""

from math import sqrt
from statistics import stdev

import numpy as np
import pytest

from progpo.advantages import AdvantageConfig, compute_advantages
from progpo.advantages.batch import StepBatch
from benchmarks.synthetic_batches import random_batch

# (traj, t, obs, action, reward, terminated, truncated, invalid)
ROWS = [
    (1, 0, "s", "a", 0.0, False, False, False), (1, 1, "k", "c", 0.0, False, False, False),
    (1, 2, "m", "e", 10.0, True, False, False),
    (2, 0, "s", "b", 0.0, False, False, False), (2, 1, "m", "f", 0.0, True, False, False),
    (3, 0, "s", "b", 0.0, False, False, False), (3, 1, "m", "e", 10.0, True, False, False),
    (4, 0, "s", "b", 0.0, False, False, False), (4, 1, "m", "x", -0.1, False, True, True),
]
NAMES = ["t1s", "t1k", "t1m", "t2s", "t2m", "t3s", "t3m", "t4s", "t4m"]
TOL = 1e-5
#: Only the transition credit (6) is left: A = C / (std_u C + eps).
CREDIT_ONLY = dict(estimator="progpo", beta_episode=0.0, use_peer=False, credit_lambda=0.0, rms_cap=0.0,
                   zero_signal="off", semantic_expansion=False, state_key="obs", depths=0)


def _batch() -> StepBatch:
    return StepBatch.from_lists(
        uid=["task"] * len(ROWS), traj_id=[r[0] for r in ROWS], step_index=[r[1] for r in ROWS],
        anchor_obs=[r[2] for r in ROWS], action=[r[3] for r in ROWS], reward=[r[4] for r in ROWS],
        terminated=[r[5] for r in ROWS], truncated=[r[6] for r in ROWS], invalid=[r[7] for r in ROWS],
        prefix_key=[f"{r[0]}|{r[1]}" for r in ROWS],
    )


def _run(**kw) -> dict[str, float]:
    return dict(zip(NAMES, compute_advantages(_batch(), AdvantageConfig(**{**CREDIT_ONLY, **kw})).advantages.tolist()))


def test_closure_potential_hand_computed():
    # Closure with the step rewards (discount gamma = 0.95; 0 after the last step, as Phi in (6)):
    #   W(u) = mean over u's visits of r + 0.95 W(next)
    #   m: 4 visits, all last steps: W(m) = (10 + 0 + 10 - 0.1) / 4 = 4.975
    #   k: its one visit goes to m: W(k) = 0 + 0.95 * 4.975 = 4.72625
    #   s: visits go to k once, to m three times: W(s) = 0.95 * (4.72625 + 3 * 4.975) / 4 = 4.667171875
    # (on binary rewards W = success_reward * V / gamma, V the closure of CRBC eqs. 8-9: here without t4's
    #  penalty W(m) = 10 * 2/4 = 5 = 10 * (0.95 * 2/4) / 0.95)
    # The pools average r + 0.95 W(next); each exact depth-0 pool averages to W: Phi = W.
    # C = r + 0.95 Phi(next) - Phi, Phi = 0 after the last step:
    #   t1s: 0.95 * 4.72625 - 4.667171875 = -0.177234375 (the detour through k costs one discount)
    #   t1k: 0.95 * 4.975 - 4.72625 = 0;   t1m, t3m: 10 - 4.975 = 5.025;   t2m: -4.975;   t4m: -0.1 - 4.975 = -5.075
    #   t2s, t3s, t4s: 0.95 * 4.975 - 4.667171875 = 0.059078125
    c = {"t1s": -0.177234375, "t1k": 0.0, "t1m": 5.025, "t2s": 0.059078125, "t2m": -4.975, "t3s": 0.059078125,
         "t3m": 5.025, "t4s": 0.059078125, "t4m": -5.075}
    # C^ = C / (sample std of the task's 9 credits + eps) (spec (6), not mean-centred)
    sd = stdev(c.values())
    got = _run(potential_target="closure")
    for name in NAMES:
        assert got[name] == pytest.approx(c[name] / (sd + 1e-6), rel=TOL, abs=TOL), name
    # mean 0; sum of squares 0.177234375^2 + 3 * 0.059078125^2 + 2 * 5.025^2 + 4.975^2 + 5.075^2 = 101.0493826982...
    assert sd == pytest.approx(sqrt(101.04938269824218 / 8), rel=1e-12)


def test_visit_average_credits_the_detour_instead():
    # The visit average (potential_target='return', CRBC's eq. 6): G of t1 = 9.025, 9.5, 10; t2 = 0, 0;
    #   t3 = 9.5, 10; t4 = -0.095, -0.1.  Phi(s) = (9.025 + 0 + 9.5 - 0.095) / 4 = 4.6075, Phi(k) = 9.5,
    #   Phi(m) = (10 + 0 + 10 - 0.1) / 4 = 4.975.
    #   t1s: 0.95 * 9.5 - 4.6075 = 4.4175 > 0: the detour is credited because t1 happened to win;
    #   t1k: 0.95 * 4.975 - 9.5 = -4.77375 < 0: the step that reached m is blamed for m's other visits.
    c = {"t1s": 4.4175, "t1k": 0.95 * 4.975 - 9.5, "t1m": 10 - 4.975, "t2s": 0.95 * 4.975 - 4.6075, "t2m": -4.975,
         "t3s": 0.95 * 4.975 - 4.6075, "t3m": 10 - 4.975, "t4s": 0.95 * 4.975 - 4.6075, "t4m": -0.1 - 4.975}
    sd = stdev(c.values())
    got = _run(potential_target="return")
    for name in NAMES:
        assert got[name] == pytest.approx(c[name] / (sd + 1e-6), rel=TOL, abs=TOL), name
    closure = _run(potential_target="closure")
    assert got["t1s"] > 0 > closure["t1s"] and got["t1k"] < 0 == closure["t1k"]


def test_closure_keeps_the_peer_and_episode_terms():
    # only Phi changes: without the credit term (use_potential=False) both targets give the same advantages, on
    # random batches with every other ProGPO term on (peers, episode term, semantic expansion off/on, fusion)
    from benchmarks.synthetic_batches import HashEncoder

    for seed in range(6):
        batch = random_batch(seed)
        for depths in (0, 2):
            kw = dict(use_potential=False, depths=depths, state_key="obs")
            a = compute_advantages(batch, AdvantageConfig(potential_target="closure", **kw), HashEncoder())
            b = compute_advantages(batch, AdvantageConfig(potential_target="return", **kw), HashEncoder())
            np.testing.assert_array_equal(a.advantages, b.advantages)


def test_closure_with_fusion_over_depths_and_expansion_differs_from_visit_average():
    # the option acts with the product defaults (depths auto, expansion on, credit_lambda, rms_cap)
    from benchmarks.synthetic_batches import HashEncoder

    batch = random_batch(3)
    a = compute_advantages(batch, AdvantageConfig(potential_target="closure", depths=2), HashEncoder()).advantages
    b = compute_advantages(batch, AdvantageConfig(depths=2), HashEncoder()).advantages
    assert np.all(np.isfinite(a)) and not np.allclose(a, b)


@pytest.mark.parametrize("kw, words", [
    (dict(potential_estimator="graph"), "potential_estimator='mc'"),
    (dict(estimator="gigpo"), "estimator='progpo'"),
])
def test_closure_refuses_what_it_cannot_act_on(kw, words):
    with pytest.raises(ValueError, match=f"potential_target='closure'.*{words}"):
        AdvantageConfig(potential_target="closure", **kw)


@pytest.mark.parametrize("seed", range(8))
def test_reward_closure_is_crbc_closure_on_binary_rewards(seed):
    # on rewards that are success_reward on a successful last step and 0 elsewhere, the closure with rewards is
    # success_reward * V / gamma, V the binary closure CRBC and GRAFT use (eqs. 8-9 / eq. 5)
    import dataclasses

    from progpo.advantages._prep import prepare
    from progpo.advantages.closure import closure, trajectory_success

    batch = random_batch(seed)
    p = prepare(batch, AdvantageConfig(state_key="obs"))
    won = np.zeros(p.S, dtype=bool)
    won[p.last] = trajectory_success(p)
    p = dataclasses.replace(p, r=np.where(won, 10.0, 0.0))
    for gamma in (0.95, 0.5, 1.0):
        binary, rewarded = closure(p, gamma), closure(p, gamma, reward=p.r)
        np.testing.assert_allclose(rewarded.values[:binary.n], 10.0 * binary.values[:binary.n] / gamma,
                                   rtol=1e-12, atol=1e-12)
        assert rewarded.values[binary.n] == rewarded.values[binary.n + 1] == 0.0
