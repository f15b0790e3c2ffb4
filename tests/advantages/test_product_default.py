"""ProGPO's product default (issue 10) and the baselines it must leave alone.

The default keys ProGPO's anchor states on observation + state_extra when the batch carries it, accumulates
the normalised credit with lambda 0.8, zeroes tasks without a return signal, pools its potentials at depth 0 and
caps the RMS of its advantages at 1; GiGPO, HGPO, GRPO, RLOO and G2PO
must give bit-for-bit what they gave before (observation keys, no zeroing), and take the same options only
when asked.
"""

import dataclasses

import numpy as np
import pytest

from progpo.advantages import AdvantageConfig, compute_advantages, config_from_preset
from benchmarks.synthetic_batches import HashEncoder, alfworld_like_batch, random_batch

BASELINES = ("gigpo", "hgpo", "grpo", "rloo", "g2po")


def test_progpo_default_fields():
    cfg = AdvantageConfig()
    assert (cfg.estimator, cfg.state_key, cfg.credit_lambda, cfg.zero_signal, cfg.depths, cfg.rms_cap) == \
        ("progpo", "auto", 0.8, "task", 0, 1.0)
    assert config_from_preset("candidate").depths == 2 and config_from_preset("paper").depths == 2
    assert AdvantageConfig(depths=3).depths == 3  # an explicit value stays
    with pytest.raises(ValueError, match=r"AdvantageConfig\.depths must be in \[0, 64\] \(or -1 = auto\)"):
        AdvantageConfig(depths=-2)
    assert cfg.for_batch(True).state_key == "obs_inventory"
    assert cfg.for_batch(False).state_key == "obs"  # a batch without state_extra: observation keys
    assert AdvantageConfig(state_key="obs").for_batch(True).state_key == "obs"  # explicit values stay
    assert config_from_preset("default") == cfg


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_are_unchanged_by_the_progpo_default(name):
    published = dict(estimator=name, state_key="obs", zero_signal="off", depths=2)  # HGPO's K = 2 levels
    assert AdvantageConfig(estimator=name).for_batch(True) == dataclasses.replace(
        AdvantageConfig(**published), credit_lambda=0.8)  # credit_lambda is ProGPO's only
    for seed in range(5):
        batch = random_batch(seed)
        got = compute_advantages(batch, AdvantageConfig(estimator=name)).advantages
        np.testing.assert_array_equal(got, compute_advantages(batch, AdvantageConfig(**published)).advantages)
    # the same state key stays available to them (and changes their advantages on an aliased batch)
    batch = alfworld_like_batch(n_tasks=4, n_traj=8, max_len=20, seed=1)
    keyed = compute_advantages(batch, AdvantageConfig(estimator=name, state_key="obs_inventory")).advantages
    plain = compute_advantages(batch, AdvantageConfig(estimator=name)).advantages
    assert name in ("grpo", "rloo") or not np.array_equal(keyed, plain)


def test_progpo_default_is_the_product_reading_on_a_batch_with_state_extra():
    batch = alfworld_like_batch(n_tasks=4, n_traj=8, max_len=20, seed=1)
    enc = HashEncoder()
    got = compute_advantages(batch, AdvantageConfig(), enc).advantages
    explicit = AdvantageConfig(state_key="obs_inventory", credit_lambda=0.8, zero_signal="task", depths=0,
                               rms_cap=1.0, zero_signal_return="discounted")
    # the default is the candidate with depth-0 potentials, the RMS cap and "no signal" judged on G_0
    assert explicit == dataclasses.replace(config_from_preset("candidate").for_batch(True), depths=0, rms_cap=1.0,
                                           zero_signal_return="discounted")
    np.testing.assert_array_equal(got, compute_advantages(batch, explicit, enc).advantages)
    paper = compute_advantages(batch, config_from_preset("paper"), enc).advantages
    assert not np.allclose(got, paper)
