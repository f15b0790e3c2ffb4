"""Adversarial configs and batches: every estimator either returns finite advantages or raises a
ValueError naming the field; never OverflowError/ZeroDivisionError or NaN/inf."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from progpo.advantages import ESTIMATORS, AdvantageConfig, StepBatch, compute_advantages
from benchmarks.synthetic_batches import HashEncoder, random_batch

ALL = sorted(ESTIMATORS)


@pytest.mark.parametrize("kw", [dict(success_reward=1e300), dict(sigma2_floor_coef=1e300, success_reward=1e10),
                                dict(success_reward=1e-300, sigma2_floor_coef=1e-300)])
def test_variance_floor_out_of_float_range_names_its_fields(kw):
    with pytest.raises(ValueError, match="sigma2_floor_coef"):
        AdvantageConfig(**kw)


@pytest.mark.parametrize("alpha", [-1000.0, -50.0, 50.0, 1000.0])
def test_hgpo_extreme_alpha_gives_finite_weighted_levels(alpha):
    """(k+1)**alpha overflows a float for alpha = 1000; the level weights only matter relatively."""
    b = random_batch(3)
    enc = HashEncoder()
    out = compute_advantages(b, AdvantageConfig(estimator="hgpo", hgpo_alpha=alpha, depths=3), enc)
    assert np.all(np.isfinite(out.advantages))
    # the limit alpha -> +inf uses only the deepest level with a partner; compare with alpha = 200
    # (weights 2**200 apart: the shallower levels are below float precision either way)
    ref_alpha = 200.0 if alpha > 0 else -200.0
    ref = compute_advantages(b, AdvantageConfig(estimator="hgpo", hgpo_alpha=ref_alpha, depths=3), enc)
    np.testing.assert_allclose(out.advantages, ref.advantages, rtol=1e-12, atol=1e-12)


def _lopsided_batch() -> StepBatch:
    """Task a: 1 single-step trajectory; task b: 64 trajectories; unicode/empty observations."""
    cols = {k: [] for k in ("uid", "traj_id", "step_index", "reward", "terminated", "truncated", "invalid",
                            "anchor_obs", "prefix_key", "action")}

    def add(uid, tid, t, r, last, obs, inv=False):
        for k, v in zip(cols, (uid, tid, t, r, last, False, inv, obs, f"{uid}|{t}|{obs}", "go")):
            cols[k].append(v)

    add("a", 0, 0, 10.0, True, "")
    rng = np.random.default_rng(0)
    for tid in range(1, 65):
        T = int(rng.integers(1, 4))
        for t in range(T):
            add("b", tid, t, float(rng.choice([0.0, 10.0, -0.1])) if t == T - 1 else -0.1, t == T - 1,
                ["", "\x00", "🙂 é\u0301", "x" * 2000][int(rng.integers(4))], inv=bool(rng.integers(2)))
    return StepBatch.from_lists(**cols)


@pytest.mark.parametrize("name", ALL)
def test_lopsided_groups_and_odd_text_are_finite(name):
    b = _lopsided_batch()
    for cfg in (AdvantageConfig(estimator=name), AdvantageConfig(estimator=name, potential_pool="loo", depths=64),
                AdvantageConfig(estimator=name, potential_estimator="graph", credit="action", credit_lambda=0.0, max_steps=4)):
        out = compute_advantages(b, cfg, HashEncoder())
        assert out.advantages.shape == (b.num_steps,) and np.all(np.isfinite(out.advantages))


_SCALES = st.sampled_from([1e-300, 1e-6, 1.0, 1e6, 1e50])


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000), name=st.sampled_from(ALL), scale=_SCALES,
       gamma=st.sampled_from([0.0, 1e-300, 0.5, 1.0]), kappa=st.sampled_from([1e-300, 8.0, 1e300]),
       m0=st.sampled_from([1e-300, 2.0, 1e300]), tau=st.sampled_from([1e-300, 0.5, 1.0]),
       eps=st.sampled_from([1e-300, 1e-6, 1e6]), eta=st.sampled_from([1e-300, 1e-6, 1e300]),
       depths=st.sampled_from([0, 1, 64]), alpha=st.sampled_from([-1e3, 0.0, 1e3]),
       pool=st.sampled_from(["inclusive", "loo"]), fusion=st.sampled_from(["ivw", "ivw_bias", "none"]),
       graph=st.booleans())
def test_fuzzed_config_and_reward_scale_stay_finite(seed, name, scale, gamma, kappa, m0, tau, eps, eta,
                                                     depths, alpha, pool, fusion, graph):
    b = random_batch(seed)
    b = StepBatch(**{**b.__dict__, "reward": b.reward * scale})
    cfg = AdvantageConfig(estimator=name, gamma=gamma, kappa=kappa, m0=m0, tau=tau, eps=eps, eta=eta,
                          depths=depths, hgpo_alpha=alpha, potential_pool=pool, fusion=fusion,
                          potential_estimator="graph" if graph else "mc", max_steps=64)
    out = compute_advantages(b, cfg, HashEncoder())
    assert np.all(np.isfinite(out.advantages))
    assert all(np.isfinite(v) for v in out.diagnostics.values())


@pytest.mark.parametrize("bad, match", [
    (lambda texts: np.full((len(texts), 4), np.nan), "non-finite"),
    (lambda texts: np.zeros((len(texts), 4)), "zero"),
    (lambda texts: np.ones((len(texts) + 1, 4)), "shape"),
    (lambda texts: np.ones(len(texts)), "shape"),
    (lambda texts: [["a"] * 4] * len(texts), "encoder returned list"),
    (lambda texts: [[1.0] * (k % 2 + 1) for k in range(len(texts))], "encoder returned list"),  # ragged
])
def test_broken_encoder_gets_a_clear_error(bad, match):
    b = random_batch(1)
    with pytest.raises(ValueError, match=match):
        compute_advantages(b, AdvantageConfig(estimator="progpo", min_peers=100), bad)


@pytest.mark.parametrize("name, make", [
    ("reward", lambda b: b.reward.astype(str)),
    ("reward", lambda b: b.reward.astype(object)),
    ("traj_id", lambda b: b.traj_id + 0.5),
    ("step_index", lambda b: b.step_index.astype(float)),
    ("terminated", lambda b: b.terminated.astype(np.int64) * 2),
    ("uid", lambda b: np.arange(b.num_steps).astype(object)),
    ("anchor_obs", lambda b: np.array([None] * b.num_steps, dtype=object)),
    ("prefix_key", lambda b: b.prefix_key.astype(str)),  # fixed-width numpy strings, not object
])
def test_directly_built_batch_with_wrong_dtype_names_the_field(name, make):
    """``StepBatch(...)`` bypasses ``from_lists``; ``validate`` (run by every estimator) checks dtypes too."""
    import dataclasses

    b = random_batch(0)
    bad = dataclasses.replace(b, **{name: make(b)})
    with pytest.raises(ValueError, match=f"StepBatch.{name}"):
        compute_advantages(bad, AdvantageConfig(estimator="gigpo"))
