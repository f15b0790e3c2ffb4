"""Every ``loss/*`` metric of the local update, by value, through the functions the trainer calls
(``update.prepare`` then ``update.ppo_update`` on a DeepSpeed actor).

One update on fresh tiny weights, two samples with prompts of 3 and 5 tokens and 2 response tokens
each, in one micro-batch. The old and reference log-probs are the current policy's, so the hand
values are: ratio 1, clip fraction 0, KL 0, policy loss = -(token mean of the advantages),
entropy = the mean entropy of the 4 response positions (recomputed here with the plain HF model),
and the gradient norm = the norm of the same loss's gradient, recomputed here by plain autograd.
A mask over the prompt tokens (the attention mask instead of the action mask) scores the second
sample's two extra prompt tokens against zero old/reference log-probs: ratio ~2.5, KL 5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from progpo.trainer.actor import Actor, ActorConfig
from progpo.run.settings import TrainSettings
from progpo.trainer.settings import ActorSettings, AdamSettings, DeepSpeedSettings, KLSettings
from progpo.trainer.update import TrainSample, UpdateConfig, ppo_update, prepare

PROMPTS = [[5, 6, 7], [10, 11, 12, 13, 14]]
RESPONSES = [[8, 9], [15, 16]]
ADVANTAGES = [1.0, -0.5]
ENTROPY_COEF = 0.01


@pytest.fixture(scope="module")
def update_metrics(tiny_model):
    """One ``ppo_update`` (one optimizer step) and the plain-model reference values."""
    from transformers import AutoModelForCausalLM

    actor = Actor(ActorConfig(actor=ActorSettings(model_name_or_path=str(tiny_model), adam=AdamSettings(lr=1e-3)),
                              # ZeRO >= 1: DeepSpeed reports the gradient norm; fp32 as the reference below
                              ds=DeepSpeedSettings(mixed_precision="off", zero_stage=1),
                              train=TrainSettings(micro_batch_size=2)))
    cfg = UpdateConfig(train=TrainSettings(batch_size=2, max_epochs=1), actor=ActorSettings(entropy_coef=ENTROPY_COEF),
                       kl=KLSettings(init_coef=0.01))
    samples = [TrainSample(p, r, a) for p, r, a in zip(PROMPTS, RESPONSES, ADVANTAGES)]
    metrics = ppo_update(actor, prepare(actor, samples, cfg), cfg, np.random.default_rng(0))

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    model.train()  # as the update runs it (the tiny model has no dropout)
    entropies, loss = [], torch.zeros(())
    for p, r, a in zip(PROMPTS, RESPONSES, ADVANTAGES):
        ids = torch.tensor([p + r])
        logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float()  # the positions predicting r
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
        probs = torch.softmax(logits, -1)
        ent = -(probs * torch.log_softmax(logits, -1)).sum(-1)
        entropies.extend(ent.tolist())
        # ratio = exp(logp - logp.detach()) = 1 with gradient d logp; k3 has zero gradient at r = 0
        loss = loss + (-(torch.exp(logp - logp.detach())) * a).sum() - ENTROPY_COEF * ent.sum()
    (loss / 4).backward()
    grad_norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.parameters() if p.grad is not None))
    return metrics, float(np.mean(entropies)), grad_norm


def test_ratio_clip_and_kl_on_fresh_weights(update_metrics):
    m, _, _ = update_metrics
    assert m["loss/ratio"] == pytest.approx(1.0, abs=1e-6)
    assert m["loss/clip_frac"] == 0.0
    assert m["loss/kl"] == pytest.approx(0.0, abs=1e-7)
    assert m["loss/optimizer_steps"] == 1.0


def test_policy_entropy_and_total_loss(update_metrics):
    m, entropy, _ = update_metrics
    assert m["loss/policy"] == pytest.approx(-(2 * 1.0 + 2 * -0.5) / 4, abs=1e-6)
    assert m["loss/entropy"] == pytest.approx(entropy, rel=1e-5)
    assert m["loss/total"] == pytest.approx(m["loss/policy"] + 0.01 * m["loss/kl"] - ENTROPY_COEF * entropy, abs=1e-6)


def test_grad_norm_is_the_norm_of_the_loss_gradient(update_metrics):
    m, _, grad_norm = update_metrics
    assert grad_norm > 0
    assert m["loss/grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
