"""Leave-one-out potentials without other trajectories (issue 12 case 9) and what the pool-size
diagnostics measure (issue 12 case 11). Expected values are written out by hand."""

from statistics import mean, stdev

import numpy as np
import pytest

from progpo.advantages import AdvantageConfig, StepBatch, compute_advantages
from benchmarks.synthetic_batches import HashEncoder

EPS = 1e-6


def _batch(rows, uid="u"):
    """rows: (traj, t, obs, action, reward, terminated)."""
    return StepBatch.from_lists(
        uid=[uid if isinstance(uid, str) else uid[r[0]] for r in rows], traj_id=[r[0] for r in rows],
        step_index=[r[1] for r in rows], anchor_obs=[r[2] for r in rows], action=[r[3] for r in rows],
        reward=[r[4] for r in rows], terminated=[r[5] for r in rows], truncated=[False] * len(rows),
        invalid=[False] * len(rows), prefix_key=[f"{r[0]}|{r[1]}" for r in rows])


WIN = [(0, 0, "You arrive at countertop 1.", "take apple 1", 0.0, False),
       (0, 1, "You pick up the apple 1.", "go to fridge 1", 0.0, False),
       (0, 2, "You arrive at fridge 1.", "cool apple 1 with fridge 1", 10.0, True)]


@pytest.mark.parametrize("kw", [{}, {"beta_episode": 0.0, "use_peer": False}, {"depths": 0},
                                {"fusion": "ivw_bias"}, {"credit_lambda": 0.8}])
def test_lone_trajectory_with_loo_pools_gets_zero(kw):
    # issue 12 case 9: the fallback baseline was the task's mean G, its own returns: -0.85 / +0.88 here
    cfg = AdvantageConfig(potential_pool="loo", **kw)
    for enc in (None, HashEncoder()):
        out = compute_advantages(_batch(WIN), cfg, enc)
        assert np.all(out.advantages == 0.0), out.advantages


def test_lone_trajectory_next_to_another_task_gets_zero_and_leaves_it_alone():
    rows = WIN + [(1, 0, "x", "a", 10.0, True), (2, 0, "x", "b", 0.0, True)]
    batch = _batch(rows, uid={0: "lone", 1: "pair", 2: "pair"})
    out = compute_advantages(batch, AdvantageConfig(potential_pool="loo", rms_cap=0.0)).advantages
    assert np.all(out[:3] == 0.0)
    # task "pair": A^E = +-10/(stdev(10, 0) + eps); each pool holds only the other trajectory, so
    # Phi = the other's G and C = r - Phi = +-10, C^ = +-10/(stdev(10, -10) + eps)
    ae = 5.0 / (stdev([10.0, 0.0]) + EPS)
    c_hat = 10.0 / (stdev([10.0, -10.0]) + EPS)
    np.testing.assert_allclose(out[3:], [ae + c_hat, -ae - c_hat], rtol=1e-12)
    # the default rms_cap = 1: the lone task is zeroed (one trajectory: no return signal) and left out of
    # the RMS, the pair's two steps have RMS ae + c_hat, so they become +-1
    out = compute_advantages(batch, AdvantageConfig(potential_pool="loo")).advantages
    assert np.all(out[:3] == 0.0)
    np.testing.assert_allclose(out[3:], [1.0, -1.0], rtol=1e-12)


def test_loo_fallback_uses_only_the_other_trajectories():
    # traj 0: a -> b (reward 10 at t=1); traj 1: c (reward 0, one step). Every loo pool is empty.
    # Fallback: the other trajectories' G at the same t, else their mean G (no longer the task mean
    # with the step's own returns in it).
    rows = [(0, 0, "a", "go", 0.0, False), (0, 1, "b", "win", 10.0, True), (1, 0, "c", "wait", 0.0, True)]
    got = compute_advantages(_batch(rows), AdvantageConfig(potential_pool="loo", beta_episode=0.0, use_peer=False,
                                                           semantic_expansion=False, credit_lambda=0.0)).advantages
    phi = {"0a": 0.0,            # same t in traj 1: G = 0
           "0b": 0.0,            # no t=1 elsewhere: mean G of traj 1 = 0 (was mean(9.5, 10, 0) = 6.5)
           "1c": 0.95 * 10.0}    # same t in traj 0: G = 9.5
    c = [0.0 + 0.95 * phi["0b"] - phi["0a"], 10.0 - phi["0b"], 0.0 - phi["1c"]]
    np.testing.assert_allclose(got, np.array(c) / (stdev(c) + EPS), rtol=1e-12)


def _expansion_batch():
    # three one-step trajectories; "at A (again)" paraphrases "at A" (HashEncoder cosine 0.9496 >= tau 0.9)
    return _batch([(0, 0, "at A", "x", 10.0, True), (1, 0, "at A (again)", "x", 0.0, True),
                   (2, 0, "at B", "x", 5.0, True)])


def test_pool_size_diagnostics_say_before_and_after_expansion():
    # issue 12 case 11: adv/pool_size_d0_mean was recorded before semantic expansion while the docs
    # said after. Now: pool_size_* = exact pools (inclusive, before expansion), pool_used_size_* = what
    # the potentials used (after loo and expansion; n_eff at depth 0).
    enc = HashEncoder()
    v = enc(["at A", "at A (again)"])
    w = float(v[0] @ v[1])
    assert 0.9 <= w < 1.0
    n_eff = (1 + w) ** 2 / (1 + w * w)
    out = compute_advantages(_expansion_batch(), AdvantageConfig(depths=0), enc).diagnostics
    assert out["adv/pool_size_d0_mean"] == 1.0 and out["adv/frac_pool_ge2_d0"] == 0.0
    assert out["adv/pool_used_size_d0_mean"] == pytest.approx((2 * n_eff + 1) / 3, rel=1e-12)
    assert out["adv/frac_pool_used_ge2_d0"] == pytest.approx(0.0)  # n_eff = 1.9987 < 2
    # loo: A and A (again) keep each other (n_eff of one member = 1); B's pool is empty
    out = compute_advantages(_expansion_batch(), AdvantageConfig(depths=0, potential_pool="loo"), enc).diagnostics
    assert out["adv/pool_size_d0_mean"] == 1.0
    assert out["adv/pool_used_size_d0_mean"] == pytest.approx(2 / 3, rel=1e-12)
    # without an encoder the used pools are the exact ones (inclusive) or one smaller (loo)
    out = compute_advantages(_expansion_batch(), AdvantageConfig(depths=0)).diagnostics
    assert out["adv/pool_used_size_d0_mean"] == out["adv/pool_size_d0_mean"] == 1.0


def test_every_estimator_reports_the_same_exact_pool_sizes():
    rows = [(0, 0, "s", "a", 0.0, False), (0, 1, "s", "b", 10.0, True), (1, 0, "s", "a", 0.0, True)]
    sizes = {name: compute_advantages(_batch(rows), AdvantageConfig(estimator=name, depths=1)).diagnostics
             for name in ("grpo", "gigpo", "progpo")}
    for d in sizes.values():
        # depth 0: "s" three times; depth 1: (start, s) twice, (s, a, s) once
        assert d["adv/pool_size_d0_mean"] == 3.0
        assert d["adv/pool_size_d1_mean"] == pytest.approx(mean([2, 1, 2]))
