"""The run's length: one field (``TrainSettings.num_iterations``) and one default on ``train`` and ``train_ray``.

Unset, it is one pass over the training tasks on both: ``ceil(tasks / --rollout.batch_size)`` iterations.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from progpo.run.settings import TrainSettings


@pytest.mark.parametrize("num_tasks,per_iteration,want", [(6, 4, 2), (16, 16, 1), (17, 16, 2), (1, 4, 1), (48, 16, 3)])
def test_an_unset_length_is_one_pass_over_the_tasks(num_tasks, per_iteration, want):
    assert TrainSettings().num_iterations is None
    assert TrainSettings().iterations(num_tasks, per_iteration) == want
    assert TrainSettings(num_iterations=5).iterations(num_tasks, per_iteration) == 5  # a given length wins


@pytest.mark.parametrize("bad", [0, -3])
def test_a_length_below_one_names_the_flag(bad):
    with pytest.raises(ValueError, match=rf"^--train.num_iterations must be >= 1, got {bad}$"):
        TrainSettings(num_iterations=bad)


def test_both_backends_hold_the_same_field_with_the_same_default():
    from progpo.openrlhf.launch import RayArgs
    from progpo.trainer.config import TrainConfig

    for cls in (TrainConfig, RayArgs):
        hints = typing.get_type_hints(cls)
        assert hints["train"] is TrainSettings, cls
        held = next(f for f in dataclasses.fields(cls) if f.name == "train")
        assert held.default_factory().num_iterations is None, cls


def test_the_local_trainer_plays_one_pass_when_the_length_is_unset(tmp_path):
    """6 tasks at 4 per iteration: 2 iterations, and the lr schedule is sized for 2."""
    from progpo.run.env_setup import open_env_pool
    from progpo.trainer.config import config_from_args
    from progpo.trainer.loop import Trainer

    cfg = config_from_args(["--actor.model_name_or_path", "tiny", "--env.name", "alfworld_like", "--env.num_tasks", "6",
                            "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "2", "--env.max_steps", "3",
                            "--actor.lr_scheduler", "cosine_with_min_lr", "--ckpt.path", str(tmp_path / "run"),
                            "--logger.progress_bar", "false"])
    assert cfg.train.num_iterations is None
    trainer = Trainer(cfg)
    with open_env_pool(cfg.env, 1) as envs:
        trainer._build(envs)
    assert trainer.num_iterations == 2
    assert trainer.actor.cfg.scheduler_steps == cfg.max_optimizer_steps(2)
