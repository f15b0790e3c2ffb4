"""The local actor's learning-rate schedule (``--actor.lr_scheduler``, ``--actor.lr_warmup_ratio``).

The lr of each optimizer step is checked by value against OpenRLHF's construction
(``transformers.get_scheduler`` with ``ceil(ratio * steps)`` warmup steps), stepped once per
optimizer step, not per micro-batch.
"""

from __future__ import annotations

import math

import pytest
import torch

from progpo.trainer.settings import ActorSettings, AdamSettings


def _lrs_of_steps(actor, n_steps: int, micro_per_step: int = 2) -> list[float]:
    """lr used by each of ``n_steps`` optimizer steps of a dummy loss, ``micro_per_step`` micro-batches each."""
    ids = torch.tensor([[1, 2, 3, 4]])
    used = []
    for _ in range(n_steps):
        used.append(actor.optimizer.param_groups[0]["lr"])
        for j in range(micro_per_step):
            actor.engine.set_gradient_accumulation_boundary(j == micro_per_step - 1)
            loss = actor.engine(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().pow(2).mean()
            actor.engine.backward(loss, scale_wrt_gas=False)
            actor.engine.step()
    return used


def test_warmup_then_constant_and_cosine_floor(tiny_model):
    from progpo.trainer.actor import Actor, ActorConfig

    lr = 1e-3
    warm = Actor(ActorConfig(actor=ActorSettings(model_name_or_path=str(tiny_model), adam=AdamSettings(lr=lr),
                                                 lr_scheduler="constant_with_warmup", lr_warmup_ratio=0.3),
                             use_ref=False, scheduler_steps=10))  # ceil(3.0) = 3 warmup steps
    assert _lrs_of_steps(warm, 5) == pytest.approx([0.0, lr / 3, 2 * lr / 3, lr, lr], abs=1e-12)

    cos = Actor(ActorConfig(actor=ActorSettings(model_name_or_path=str(tiny_model), adam=AdamSettings(lr=lr),
                                                lr_scheduler="cosine_with_min_lr", lr_warmup_ratio=0.25, min_lr_ratio=0.1),
                            use_ref=False, scheduler_steps=4))  # 1 warmup step
    got = _lrs_of_steps(cos, 5)
    # after warmup: min + (1 - min) * 0.5 * (1 + cos(pi * progress)), progress = (k - 1) / 3
    want = [0.0] + [lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (k - 1) / 3)))) for k in range(1, 5)]
    assert got == pytest.approx(want, abs=1e-12)
    assert got[-1] == pytest.approx(0.1 * lr)


def test_constant_default_leaves_lr_alone(tiny_model):
    from progpo.trainer.actor import Actor, ActorConfig

    actor = Actor(ActorConfig(actor=ActorSettings(model_name_or_path=str(tiny_model), adam=AdamSettings(lr=2e-4)),
                              use_ref=False))
    assert actor.scheduler is None
    assert _lrs_of_steps(actor, 3, micro_per_step=1) == [2e-4] * 3


def test_schedule_flags_reach_the_actor():
    from progpo.trainer.config import TrainConfig, config_from_args

    cfg = config_from_args(["--actor.lr_scheduler", "cosine_with_min_lr", "--actor.lr_warmup_ratio", "0.1",
                            "--actor.min_lr_ratio", "0.2", "--env.name", "alfworld_like", "--env.max_steps", "8",
                            "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "16",
                            "--train.batch_size", "64", "--train.num_iterations", "5", "--train.max_epochs", "2"])
    a = cfg.actor_config(cfg.train.iterations(0, 2))  # --train.num_iterations 5 given: no task count needed
    assert (a.actor.lr_scheduler, a.actor.lr_warmup_ratio, a.actor.min_lr_ratio) == ("cosine_with_min_lr", 0.1, 0.2)
    assert a.scheduler_steps == 5 * 2 * 4  # ceil(2 * 16 * 8 / 64) = 4 optimizer steps per epoch at most
    assert isinstance(cfg, TrainConfig)


def test_max_optimizer_steps_by_hand():
    from progpo.run.settings import max_optimizer_steps

    assert max_optimizer_steps(24, 1, 2, 32, 8, 32) == 24 * 16  # 2 x 32 x 8 = 512 step samples at most: 16 steps
    assert max_optimizer_steps(1, 3, 1, 3, 5, 4) == 3 * 4  # ceil(15 / 4) = 4 per epoch
    assert max_optimizer_steps(2, 1, 1, 2, 1, 64) == 2  # fewer samples than a batch: still one step
    with pytest.raises(ValueError, match="train_batch_size must be >= 1, got 0"):
        max_optimizer_steps(1, 1, 1, 1, 1, 0)


@pytest.mark.parametrize("flag,value,start", [
    ("--actor.lr_scheduler", "cosine_wrong", "--actor.lr_scheduler"),
    ("--actor.lr_scheduler", "reduce_lr_on_plateau", "--actor.lr_scheduler"),
    ("--actor.lr_warmup_ratio", "1.5", "--actor.lr_warmup_ratio"),
    ("--actor.min_lr_ratio", "-0.1", "--actor.min_lr_ratio"),
])
def test_bad_schedule_flags_name_the_flag(flag, value, start):
    from progpo.trainer.config import config_from_args

    with pytest.raises(ValueError) as err:
        config_from_args([flag, value])
    assert str(err.value).startswith(start)
