"""A diverging update never reaches a checkpoint on the OpenRLHF path (issue 44, item 2).

* OpenRLHF 0.11.2's own ``ActorPPOTrainer.training_step`` (through :class:`StepActorPPOTrainer`) on a real
  DeepSpeed engine over the tiny Qwen2, in one process: a micro-batch whose advantages are NaN is skipped
  (ZeRO-2: DeepSpeed's overflow check; ZeRO-0 fp32: the bare optimizer under ``guard_optimizer``; weights
  unchanged, ``engine.skipped_steps`` 1) and counted; the next, finite one is applied and ends the streak.
* The trainer actor's ``save_logs_and_checkpoints``: no checkpoint after a step with a skipped update, and the
  run stops after ``--train.max_nonfinite_skips`` skipped steps in a row with one line (iteration, flag).
* ``train_ray`` turns that stop into exit status 5 and the one line.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from progpo.run.divergence import EXIT_NONFINITE, NonFiniteUpdate, SkipStreak
from progpo.run.metrics import SKIPPED_KEY
from progpo.run.settings import TrainSettings


@pytest.fixture(scope="module")
def mods(cpu_compat):
    with cpu_compat.import_shims():
        from openrlhf.models import Actor, PolicyLoss
        from openrlhf.utils.deepspeed.deepspeed import DeepspeedStrategy
        from openrlhf.utils.loss_utils import _optimizer_step_loss_norm

        from progpo.cli import train_ray
        from progpo.openrlhf import actors, trainer

        return SimpleNamespace(Actor=Actor, PolicyLoss=PolicyLoss, Strategy=DeepspeedStrategy, actors=actors,
                               trainer=trainer, train_ray=train_ray, norm=_optimizer_step_loss_norm)


def _experience(advantage: float):
    """One two-row micro-batch (prompt 3 tokens, response 2) with the behaviour log-probs of the model at hand
    filled in by the caller."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    seq = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1]])
    return Experience(sequences=seq, attention_mask=torch.ones_like(seq), action_mask=mask,
                      action_log_probs=torch.zeros(2, 4), base_action_log_probs=torch.zeros(2, 4),
                      advantages=torch.tensor([[advantage] * 4, [-0.5] * 4]) * mask, returns=torch.zeros(2, 4),
                      response_length=torch.tensor([2, 2]), total_length=torch.tensor([5.0, 5.0]), info={})


def _trainer(mods, engine):
    class OneRankDeepSpeed:
        """The surface ``ActorPPOTrainer`` uses, one process; backward and step are DeepSpeed's, as OpenRLHF's."""

        backward = mods.Strategy.backward
        optimizer_step = mods.Strategy.optimizer_step
        get_grad_norm = mods.Strategy.get_grad_norm
        ring_attn_group = None

    args = SimpleNamespace(
        actor=SimpleNamespace(entropy_coef=None, aux_loss_coef=0.0),
        algo=SimpleNamespace(kl=SimpleNamespace(use_loss=False, init_coef=0.0)),
        train=SimpleNamespace(dynamic_batch_enable=False), ds=SimpleNamespace(packing_samples=False))
    t = mods.actors.StepActorPPOTrainer.__new__(mods.actors.StepActorPPOTrainer)
    actor = mods.Actor(engine.module)
    actor.model, actor.packing_samples = engine, False
    t.strategy, t.args, t.actor, t.ema_model, t.aux_loss = OneRankDeepSpeed(), args, actor, None, False
    t.actor_optim, t.actor_scheduler = None, SimpleNamespace(get_last_lr=lambda: [1e-3])
    t.actor_loss_fn = mods.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, token_level_loss=True)
    t.progpo_skips = SkipStreak(limit=3)
    return t


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_openrlhf_training_step_skips_and_counts_a_nan_update(mods, zero_stage):
    import deepspeed
    from transformers import AutoModelForCausalLM

    from progpo.run.tiny_model import tiny_model_path
    from progpo.trainer.actor import init_single_process_distributed

    init_single_process_distributed()
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path()), dtype=torch.float32)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config={
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
        "zero_optimization": {"stage": zero_stage}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9})
    # ZeRO-0 fp32: the bare optimizer is guarded; ZeRO-2: its wrapper checks the grad norm, the inner one the lr
    assert mods.actors.guard_engine(engine) == (["optimizer"] if zero_stage == 0 else ["basic_optimizer"])
    t = _trainer(mods, engine)
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    nan, finite = _experience(float("nan")), _experience(1.0)
    t.training_step(nan, 0.0, 0, mods.norm([nan.action_mask], None, 1, 1))
    assert (engine.skipped_steps, t.progpo_skips.streak) == (1, 1)
    assert all(torch.equal(before[k], v) for k, v in engine.module.state_dict().items())
    t.training_step(finite, 0.0, 1, mods.norm([finite.action_mask], None, 1, 1))
    assert (engine.skipped_steps, t.progpo_skips.streak, t.progpo_skips.take_skipped()) == (1, 0, 1)
    after = {k: v.clone() for k, v in engine.module.state_dict().items()}
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for group in engine.basic_optimizer.param_groups:  # an inf lr with finite gradients: skipped by the lr check
        group["lr"] = float("inf")
    t.training_step(finite, 0.0, 2, mods.norm([finite.action_mask], None, 1, 1))
    assert (t.progpo_skips.streak, t.progpo_skips.take_skipped()) == (1, 1)
    assert all(torch.equal(after[k], v) for k, v in engine.module.state_dict().items())


def _trainer_actor(mods, tmp_path, limit):
    from progpo.openrlhf.launch import RayArgs, RayRun

    class OpenRLHFTrainer:
        """OpenRLHF's ``save_logs_and_checkpoints`` rule: a checkpoint when ``global_step % save_steps == 0``."""

        def __init__(self, args):
            self.args, self.saved = args, []

        def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):
            if global_step % self.args.ckpt.save_steps == 0:
                self.saved.append(global_step)

    class Trainer(mods.trainer._ProGPOTrainerMixin, OpenRLHFTrainer):
        pass

    run = RayRun(settings=RayArgs(train=TrainSettings(max_nonfinite_skips=limit)))
    args = SimpleNamespace(progpo=run, ckpt=SimpleNamespace(save_steps=1, path=str(tmp_path)),
                           actor=SimpleNamespace(adam=SimpleNamespace(lr=1e30)))
    return Trainer(args)


def test_no_checkpoint_after_a_skipped_update_and_a_stop_at_the_limit(mods, tmp_path):
    t = _trainer_actor(mods, tmp_path, limit=2)
    (tmp_path / "_actor").mkdir()
    (tmp_path / "_actor" / "latest").write_text("global_step1")
    for step, (skipped, streak) in enumerate([(0, 0), (1, 1)], start=1):
        t._progpo_skip_streak = streak
        t.save_logs_and_checkpoints(step, {SKIPPED_KEY: float(skipped)})
    assert t.saved == [1] and t.args.ckpt.save_steps == 1
    t._progpo_skip_streak = 2
    with pytest.raises(NonFiniteUpdate) as exc:
        t.save_logs_and_checkpoints(3, {SKIPPED_KEY: 1.0})
    line = str(exc.value)
    assert "\n" not in line and line.startswith("iteration 3: 2 consecutive optimizer steps skipped")
    assert "--actor.adam.lr (now 1e+30)" in line and "global_step1" in line
    assert t.saved == [1]


def test_train_ray_turns_the_stop_into_one_line_and_exit_5(train_ray_stopped_by, capsys):
    cause = NonFiniteUpdate("iteration 3: 2 consecutive optimizer steps skipped for a non-finite loss or gradient "
                            "norm (--train.max_nonfinite_skips 2); the updates diverge: lower --actor.adam.lr (now 1)")
    assert train_ray_stopped_by(cause, "--train.max_nonfinite_skips", "2") == EXIT_NONFINITE == 5
    assert capsys.readouterr().err.strip().splitlines() == [f"python -m progpo.cli.train_ray: error: {cause}"]
