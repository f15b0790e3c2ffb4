"""``rms_cap``: ProGPO's advantages scaled to an RMS of at most ``rms_cap`` over the steps that keep one,
against values computed by hand; the baselines ignore it."""

from math import sqrt

import numpy as np
import pytest

from progpo.advantages import AdvantageConfig, compute_advantages
from progpo.advantages.batch import StepBatch
from progpo.advantages.config import config_from_preset
from progpo_tests.reference import reference_progpo


def _batch() -> StepBatch:
    # task "win": three one-step trajectories with returns 10, 0, 0; task "flat": three with return 0
    rewards = [10.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    return StepBatch.from_lists(
        uid=["win"] * 3 + ["flat"] * 3, traj_id=list(range(6)), step_index=[0] * 6, reward=rewards,
        terminated=[True] * 6, truncated=[False] * 6, invalid=[False] * 6, anchor_obs=["start"] * 6,
        prefix_key=["p"] * 6, action=["a", "b", "b", "a", "b", "b"],
    )


def _progpo(**kw) -> np.ndarray:
    # no step-level terms: A = beta_episode * A^E, with A^E(win) = (R - 10/3) / stdev(10, 0, 0) = 2/sqrt(3),
    # -1/sqrt(3), -1/sqrt(3) (up to eps) and A^E(flat) = 0
    cfg = AdvantageConfig(estimator="progpo", use_peer=False, use_potential=False, **kw)
    got = compute_advantages(_batch(), cfg)
    np.testing.assert_allclose(got.advantages, reference_progpo(_batch(), cfg), rtol=1e-12, atol=1e-12)
    return got.advantages


def test_rms_cap_scales_the_kept_steps_to_the_cap():
    # beta 2: raw 4/sqrt3, -2/sqrt3, -2/sqrt3 on "win"; "flat" is zeroed (zero_signal task) and left out of
    # the RMS: sqrt((16/3 + 4/3 + 4/3) / 3) = sqrt(8/3) > 1, so the factor is sqrt(3/8): sqrt2, -1/sqrt2
    np.testing.assert_allclose(_progpo(beta_episode=2.0), [sqrt(2), -1 / sqrt(2), -1 / sqrt(2), 0, 0, 0], rtol=1e-12)
    np.testing.assert_allclose(_progpo(beta_episode=2.0, rms_cap=0.5),
                               [sqrt(2) / 2, -sqrt(2) / 4, -sqrt(2) / 4, 0, 0, 0], rtol=1e-12)
    # zero_signal off (or batch, which zeroes nothing here): "flat" keeps its zeros and counts in the RMS,
    # sqrt((16/3 + 4/3 + 4/3) / 6) = 2/sqrt3: 2, -1, -1
    for scope in ("off", "batch"):
        np.testing.assert_allclose(_progpo(beta_episode=2.0, zero_signal=scope), [2, -1, -1, 0, 0, 0], rtol=1e-12)
    # off: the spec's (7) unscaled, 2 A^E
    raw = _progpo(beta_episode=2.0, rms_cap=0.0)
    np.testing.assert_allclose(raw[:3] * sqrt(3) / 2, [2, -1, -1], rtol=1e-6)


def test_rms_cap_never_enlarges_and_keeps_signs_and_ranks():
    # beta 1: RMS sqrt((4/3 + 1/3 + 1/3) / 3) = sqrt(2/3) < 1: unchanged
    assert np.array_equal(_progpo(), _progpo(rms_cap=0.0))
    cfg = AdvantageConfig()
    assert cfg.rms_cap == 1.0 and config_from_preset("paper").rms_cap == 0.0
    assert config_from_preset("candidate").rms_cap == 0.0


def test_all_zero_and_fully_zeroed_batches_stay_zero():
    flat = StepBatch.from_lists(uid=["u"] * 2, traj_id=[0, 1], step_index=[0, 0], reward=[1.0, 1.0],
                                terminated=[True] * 2, truncated=[False] * 2, invalid=[False] * 2,
                                anchor_obs=["s"] * 2, prefix_key=["p"] * 2, action=["a", "b"])
    for scope in ("task", "batch", "off"):
        got = compute_advantages(flat, AdvantageConfig(zero_signal=scope))
        assert np.all(got.advantages == 0.0) and got.diagnostics["adv/rms_scale"] == 1.0


@pytest.mark.parametrize("name", ["grpo", "gigpo", "hgpo", "rloo"])
def test_baselines_ignore_rms_cap(name):
    batch = _batch()
    a = compute_advantages(batch, AdvantageConfig(estimator=name, rms_cap=0.0)).advantages
    b = compute_advantages(batch, AdvantageConfig(estimator=name, rms_cap=0.25)).advantages
    assert np.array_equal(a, b)
