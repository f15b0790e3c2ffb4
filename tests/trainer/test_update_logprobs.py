"""The update's log-prob passes that can be left out are left out exactly: behaviour log-probs of the first
optimizer step's samples come from that step's own forward pass, and while the policy equals the reference
the reference log-probs are the behaviour ones. The weights after the update equal those of an update that
computes every pass (tiny random model, 12 samples, 2 epochs; seconds)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from progpo.run.settings import TrainSettings

from progpo.trainer.settings import ActorSettings, AdamSettings, DeepSpeedSettings, KLSettings, LoraSettings
from progpo.trainer.update import TrainSample, UpdateConfig, has_dropout, ppo_update, prepare


def _samples(seed: int = 0) -> list[TrainSample]:
    g = np.random.default_rng(seed)
    return [TrainSample([int(t) for t in g.integers(3, 200, size=int(g.integers(5, 14)))],
                        [int(t) for t in g.integers(3, 200, size=int(g.integers(2, 7)))], float(g.choice([-1.0, 0.5, 1.0])))
            for _ in range(12)]


def _update(actor, cfg, *, defer: bool, same_ref: bool):
    calls = []
    logprobs = actor.logprobs
    actor.logprobs = lambda pairs, *a, **k: calls.append((len(pairs), k.get("reference", False))) or logprobs(pairs, *a, **k)
    samples = prepare(actor, _samples(), cfg, defer_behaviour=defer, policy_is_reference=same_ref)
    metrics = ppo_update(actor, samples, cfg, np.random.default_rng(0), ref_follows_old=same_ref)
    return samples, metrics, calls


@pytest.mark.parametrize("lora", [0, 4])
def test_skipped_passes_give_the_update_of_every_pass(tiny_model, lora):
    from progpo.trainer.actor import Actor, ActorConfig

    cfg = UpdateConfig(train=TrainSettings(batch_size=5, max_epochs=2), kl=KLSettings(init_coef=0.1))
    acfg = ActorConfig(actor=ActorSettings(model_name_or_path=str(tiny_model), adam=AdamSettings(lr=1e-3)),
                       ds=DeepSpeedSettings(mixed_precision="off",  # fp32: the two paths agree exactly only without bf16 rounding
                                            lora=LoraSettings(rank=lora, alpha=8)),
                       train=TrainSettings(micro_batch_size=2))
    full, lean = Actor(acfg), Actor(acfg)
    assert not has_dropout(lean.model)
    start = {n: p.detach().clone() for n, p in full.model.named_parameters() if p.requires_grad}
    s_full, m_full, c_full = _update(full, cfg, defer=False, same_ref=False)
    s_lean, m_lean, c_lean = _update(lean, cfg, defer=True, same_ref=True)
    assert c_full == [(12, False), (12, True)]  # behaviour and reference passes over every sample
    assert c_lean == [(7, False)]  # only the samples after the first optimizer step (12 - 5), no reference pass
    assert m_full["loss/optimizer_steps"] == m_lean["loss/optimizer_steps"] == 6
    for a, b in zip(s_full, s_lean):
        torch.testing.assert_close(b.old_logprobs, a.old_logprobs, rtol=0, atol=1e-5)
        torch.testing.assert_close(b.ref_logprobs, a.ref_logprobs, rtol=0, atol=1e-5)
    for key in ("loss/policy", "loss/kl", "loss/ratio", "loss/clip_frac"):
        assert m_lean[key] == pytest.approx(m_full[key], abs=1e-5), key
    pf, pl = dict(full.model.named_parameters()), dict(lean.model.named_parameters())
    for name, p in pf.items():
        torch.testing.assert_close(pl[name], p, rtol=0, atol=1e-5)
    assert max(float((pf[n].detach() - p0).abs().max()) for n, p0 in start.items()) > 1e-4  # the update moved the policy


def test_dropout_keeps_the_behaviour_pass(tiny_model):
    from progpo.trainer.actor import Actor, ActorConfig

    actor = Actor(ActorConfig(actor=ActorSettings(model_name_or_path=str(tiny_model)),
                              ds=DeepSpeedSettings(lora=LoraSettings(rank=4, alpha=8, dropout=0.1)),
                              train=TrainSettings(micro_batch_size=2)))
    assert has_dropout(actor.model)
    _, _, calls = _update(actor, UpdateConfig(train=TrainSettings(batch_size=5), kl=KLSettings(init_coef=0.1)), defer=True, same_ref=True)
    assert calls == [(12, False)]  # every behaviour log-prob from an eval pass; the reference ones are those
