"""The vectorised estimators equal the slow loop oracle (``progpo_tests.reference``) on 50 seeded
random batches, each with its own random config (every ProGPO flag, E1-E3, credit_lambda, zero_signal,
sigma2_floor_ref, rms_cap and potential_target included; for G2PO every field it reads)."""

import numpy as np
import pytest

from progpo.advantages import AdvantageConfig, compute_advantages
from progpo_tests.reference import (reference_crbc, reference_g2po, reference_gigpo, reference_graft,
                                         reference_pgpo, reference_progpo)
from benchmarks.synthetic_batches import HashEncoder, random_batch

ENC = HashEncoder()


def _random_cfg(seed: int) -> AdvantageConfig:
    rng = np.random.default_rng(1000 + seed)
    graph = seed % 4 == 3
    credit = str(rng.choice(["transition", "action"])) if graph else "transition"
    return AdvantageConfig(
        credit_lambda=float(rng.choice([0.0, 0.8, 1.0])) if credit == "transition" else 0.0,
        zero_signal=bool(rng.random() < 0.5),
        sigma2_floor_ref=str(rng.choice(["batch", "success_reward"])),
        fusion=str(rng.choice(["ivw", "ivw_bias", "none"])),
        potential_pool=str(rng.choice(["inclusive", "loo"])),
        prefix_mode=str(rng.choice(["prompt", "history"])),
        state_key=str(rng.choice(["obs", "obs_inventory"])),
        potential_estimator="graph" if graph else "mc",
        credit=credit,
        depths=int(rng.integers(0, 4)),
        kappa=float(rng.choice([1.0, 8.0])),
        use_peer=bool(rng.random() < 0.8),
        use_potential=bool(rng.random() < 0.9),
        episode_norm=str(rng.choice(["mean_std_norm", "mean_norm"])),
        gigpo_mode=str(rng.choice(["mean_std_norm", "mean_norm"])),
        min_peers=int(rng.integers(1, 4)),
        beta_episode=float(rng.choice([0.0, 1.0])),
        max_steps=8 + int(rng.integers(0, 3)),
        tau=float(rng.choice([0.9, 0.97])),
        gamma=float(rng.choice([0.95, 0.5, 1.0])),
        semantic_expansion=bool(rng.random() < 0.8),
        rms_cap=float(rng.choice([0.0, 0.5, 1.0])),
        potential_target="return" if graph else str(rng.choice(["return", "closure"])),
    )


@pytest.mark.parametrize("seed", range(50))
def test_progpo_and_gigpo_equal_the_loop_oracle(seed):
    batch = random_batch(seed, paraphrased_finals=seed % 2 == 1)
    cfg = _random_cfg(seed)
    encoder = ENC if seed % 3 else None
    got = compute_advantages(batch, cfg, encoder).advantages
    np.testing.assert_allclose(got, reference_progpo(batch, cfg, encoder), rtol=1e-8, atol=1e-8)
    gcfg = AdvantageConfig(estimator="gigpo", state_key=cfg.state_key, gigpo_mode=cfg.gigpo_mode, gamma=cfg.gamma,
                           zero_signal=cfg.zero_signal)
    np.testing.assert_allclose(compute_advantages(batch, gcfg).advantages, reference_gigpo(batch, gcfg),
                               rtol=1e-10, atol=1e-10)


def test_default_config_equals_oracle_with_and_without_encoder():
    for seed in range(5):
        batch = random_batch(100 + seed, n_tasks=3)
        for enc in (None, ENC):
            cfg = AdvantageConfig()
            np.testing.assert_allclose(compute_advantages(batch, cfg, enc).advantages,
                                       reference_progpo(batch, cfg, enc), rtol=1e-8, atol=1e-8)


def test_closure_potentials_equal_oracle_with_fusion_expansion_and_loo():
    # the closure option under every pool rule: fused over depths 0..2, expanded, leave-one-out, E3 keys
    for seed in range(4):
        batch = random_batch(200 + seed, n_tasks=3)
        for kw in (dict(), dict(depths=2, potential_pool="loo"), dict(depths=1, fusion="ivw_bias", state_key="obs")):
            cfg = AdvantageConfig(potential_target="closure", **kw)
            for enc in (None, ENC):
                np.testing.assert_allclose(compute_advantages(batch, cfg, enc).advantages,
                                           reference_progpo(batch, cfg, enc), rtol=1e-8, atol=1e-8)


def test_random_batches_exercise_expansion_and_loo():
    # guard against an oracle test that never reaches the interesting branches
    used = 0.0
    for seed in range(10):
        out = compute_advantages(random_batch(seed), AdvantageConfig(potential_pool="loo"), ENC)
        used += out.diagnostics["adv/frac_semantic_expansion"]
    assert used > 0


@pytest.mark.parametrize("seed", range(50))
def test_g2po_equals_the_loop_oracle(seed):
    rng = np.random.default_rng(2000 + seed)
    batch = random_batch(seed)
    cfg = AdvantageConfig(
        estimator="g2po", g2po_edge=str(rng.choice(["td", "progress"])),
        g2po_reading=str(rng.choice(["released", "text"])), success_reward=float(rng.choice([10.0, 9.0])),
        state_key=str(rng.choice(["obs", "obs_inventory"])),
        gigpo_mode=str(rng.choice(["mean_std_norm", "mean_norm"])),
        episode_norm=str(rng.choice(["mean_std_norm", "mean_norm"])),
        gamma=float(rng.choice([0.95, 0.5, 1.0])), omega=float(rng.choice([1.0, 0.5, 2.0])),
        zero_signal=str(rng.choice(["off", "task", "batch"])),
    )
    np.testing.assert_allclose(compute_advantages(batch, cfg).advantages, reference_g2po(batch, cfg),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("estimator", ["pgpo", "crbc", "graft"])
def test_peer_papers_equal_the_loop_oracle(seed, estimator):
    # every field the three read, drawn at random; closure values by Bellman backups in the oracle, by one
    # linear solve per task here
    rng = np.random.default_rng(3000 + seed)
    batch = random_batch(seed)
    cfg = AdvantageConfig(
        estimator=estimator, state_key=str(rng.choice(["obs", "obs_inventory"])),
        gigpo_mode=str(rng.choice(["mean_std_norm", "mean_norm"])),
        episode_norm=str(rng.choice(["mean_std_norm", "mean_norm"])),
        gamma=float(rng.choice([0.95, 0.5, 0.98, 1.0])), omega=float(rng.choice([1.0, 5.0])),
        beta_episode=float(rng.choice([0.0, 1.0])), zero_signal=str(rng.choice(["off", "task", "batch"])),
        pgpo_alpha=float(rng.choice([0.0, 2.0, 0.5])), pgpo_beta=float(rng.choice([1.0, 0.3])),
        pgpo_gamma=float(rng.choice([1.0, 0.9])), crbc_beta=float(rng.choice([0.98, 0.5, 1.0])),
        graft_gamma=float(rng.choice([0.99, 0.5, 1.0])), crbc_sigma_min=float(rng.choice([0.1, 1e-3, 2.0])),
        graft_lambda=float(rng.choice([0.0, 0.8, 0.95, 1.0])), success_reward=float(rng.choice([10.0, 9.0])),
    )
    oracle = {"pgpo": reference_pgpo, "crbc": reference_crbc, "graft": reference_graft}[estimator]
    np.testing.assert_allclose(compute_advantages(batch, cfg).advantages, oracle(batch, cfg), rtol=1e-8, atol=1e-8)
