"""The OpenRLHF path's policy actor switches dropout off, as the local backend does.

OpenRLHF 0.11.2 scores the old log-probs in eval mode (``PolicyModelActor.forward``) but runs its
update's forward in train mode (``fit`` -> ``self.actor.train()``), so a checkpoint with
``attention_dropout > 0`` gives a noisy ratio and a KL > 0 to an equal reference. Here OpenRLHF's own
``Actor`` (the model class its policy actor builds) is loaded from such a checkpoint by the parent's
set-up (stubbed to skip DeepSpeed and the distributed group); our actor's ``init_model_from_pretrained``
must leave the train-mode forward deterministic.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


@pytest.fixture(scope="module")
def dropout_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from progpo.run.tiny_model import tiny_model_path

    out = tmp_path_factory.mktemp("dropout_model")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path()))
    model.config.attention_dropout = 0.1
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(tiny_model_path())).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def mods(cpu_compat):
    with cpu_compat.import_shims():
        from openrlhf.models import Actor
        from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor

        from progpo.openrlhf import trainer

        return SimpleNamespace(Actor=Actor, ActorPPOTrainer=ActorPPOTrainer, parent=PolicyModelActor.__ray_actor_class__,
                               ours=trainer.ProGPOPolicyModelActor.__ray_actor_class__)


def _train_mode_logprobs(actor) -> list[torch.Tensor]:
    seq = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    attn = torch.ones_like(seq)
    action_mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    actor.train()
    with torch.no_grad():
        return [actor(seq, action_mask, attn) for _ in range(3)]


def test_policy_actor_update_forward_is_deterministic(mods, monkeypatch, dropout_model):
    def parent_setup(self, strategy, pretrain, max_steps=None, vllm_engines=None):  # OpenRLHF's, minus DeepSpeed
        self.actor = mods.Actor(pretrain, attn_implementation="eager", param_dtype="bf16")
        self.ema_model = None
        self.trainer = mods.ActorPPOTrainer.__new__(mods.ActorPPOTrainer)  # the class OpenRLHF builds

    monkeypatch.setattr(mods.parent, "init_model_from_pretrained", parent_setup)
    plain = mods.parent.__new__(mods.parent)
    plain.init_model_from_pretrained(None, str(dropout_model))
    noisy = _train_mode_logprobs(plain.actor)
    assert not torch.equal(noisy[0], noisy[1])  # OpenRLHF alone: dropout in the update's forward

    ours = mods.ours.__new__(mods.ours)
    ours.init_model_from_pretrained(None, str(dropout_model))
    a, b, c = _train_mode_logprobs(ours.actor)
    assert torch.equal(a, b) and torch.equal(b, c)
    ours.actor.eval()
    with torch.no_grad():  # the old-log-prob pass (eval mode) gives the same values
        seq = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
        old = ours.actor(seq, torch.tensor([[0, 0, 0, 1, 1, 1, 1]], dtype=torch.bool), torch.ones_like(seq))
    assert torch.equal(old, a)
