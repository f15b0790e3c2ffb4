"""Dropout never makes the log-probs of the same weights differ: rollout, old, reference and update.

A tiny model whose config sets ``attention_dropout: 0.1`` (Qwen2 applies it in train mode only), lr
1e-12 so that the policy does not move, two iterations of generate (HFGenerator restores train mode
afterwards) -> prepare (old and reference log-probs) -> ppo_update. With dropout on in any of these
passes the ratio read 0.99995 then 1.006 and ``loss/kl`` 2.1e-4 although the policy equals the
reference. Expected: ratio 1 (+-1e-6), clip fraction 0, KL 0, and the rollout's own log-probs equal
the recomputed old ones.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from progpo.agents.types import SamplingParams
from progpo.run.generation import HFGenerator
from progpo.run.models import disable_dropout
from progpo.trainer.actor import Actor, ActorConfig
from progpo.run.settings import TrainSettings
from progpo.trainer.settings import ActorSettings, AdamSettings, DeepSpeedSettings, KLSettings
from progpo.trainer.update import TrainSample, UpdateConfig, ppo_update, prepare


@pytest.fixture(scope="module")
def dropout_model(tiny_model, tmp_path_factory):
    """The tiny model saved again with ``attention_dropout: 0.1``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("dropout_model")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    model.config.attention_dropout = 0.1
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(tiny_model)).save_pretrained(out)
    return out


def test_ppo_iterations_see_ratio_one_and_zero_kl(dropout_model):
    actor = Actor(ActorConfig(actor=ActorSettings(model_name_or_path=str(dropout_model), adam=AdamSettings(lr=1e-12)),
                              ds=DeepSpeedSettings(mixed_precision="off"),  # fp32: the equalities are exact only without bf16 rounding
                              train=TrainSettings(micro_batch_size=4)))
    assert actor.model.model.layers[0].self_attn.attention_dropout == 0.0
    cfg = UpdateConfig(train=TrainSettings(batch_size=8, max_epochs=1), kl=KLSettings(init_coef=0.01))
    rng = np.random.default_rng(0)
    tok = actor.tokenizer
    prompts = [tok(f"<|im_start|>user\ngo to room {k}<|im_end|>\n<|im_start|>assistant\n",
                   add_special_tokens=False)["input_ids"] for k in range(8)]
    for iteration in range(2):
        generator = HFGenerator(actor.model, tok, seed=iteration)

        async def rollout():
            return await asyncio.gather(*(generator(p, SamplingParams(max_new_tokens=6, seed=k))
                                          for k, p in enumerate(prompts)))

        gens = asyncio.run(rollout())
        assert actor.model.training == (iteration > 0)  # the generator restored the update's train mode
        samples = [TrainSample(p, g.token_ids, advantage=1.0 if k % 2 else -1.0) for k, (p, g) in
                   enumerate(zip(prompts, gens))]
        behaviour = {tuple(p + g.token_ids): g.logprobs for p, g in zip(prompts, gens)}
        samples = prepare(actor, samples, cfg, defer_behaviour=False)  # the behaviour pass, to compare it
        for s in samples:  # rollout log-probs == old log-probs (both passes deterministic)
            np.testing.assert_allclose(s.old_logprobs.numpy(), behaviour[tuple(s.prompt_ids + s.response_ids)],
                                       atol=2e-5)
            np.testing.assert_allclose(s.ref_logprobs.numpy(), s.old_logprobs.numpy(), atol=1e-6)
        m = ppo_update(actor, samples, cfg, rng)
        assert m["loss/ratio"] == pytest.approx(1.0, abs=1e-6), (iteration, m)
        assert m["loss/clip_frac"] == 0.0
        assert m["loss/kl"] == pytest.approx(0.0, abs=1e-9), (iteration, m)


def test_disable_dropout_covers_modules_attributes_and_config(dropout_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(dropout_model))
    model.lm_head = torch.nn.Sequential(torch.nn.Dropout(0.5), model.lm_head)
    changed = disable_dropout(model)
    assert changed["config.attention_dropout"] == 0.1
    assert changed["model.layers.0.self_attn.attention_dropout"] == 0.1
    assert changed["lm_head.0.p"] == 0.5
    assert model.config.attention_dropout == 0.0
    model.train()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)
    assert disable_dropout(model) == {}  # idempotent
