"""A diverging update never reaches a checkpoint (issue 44, item 2), on the local backend.

* :class:`~progpo.run.divergence.FiniteAdamW` skips a step with a non-finite gradient or lr and changes nothing
  (hand values of AdamW's first step: ``p - lr * sign(g)``).
* A NaN hidden under a zero mask gives a NaN loss with finite gradients; the poisoned loss makes them NaN.
* ``ppo_update`` on a DeepSpeed actor (ZeRO-0, the client AdamW; ZeRO-2, DeepSpeed's own overflow check) skips the
  step of a NaN advantage: weights unchanged, ``engine.skipped_steps`` 1, ``loss/update_skipped_nonfinite`` 1.
* ``python -m progpo.cli.train`` with a learning rate so large that iteration 1's step leaves huge weights (so
  iteration 2's loss is NaN) exits 5 with one line naming the iteration and ``--actor.adam.lr``, and its newest
  checkpoint is iteration 1's, finite and equal to the weights iteration 1 ended with. (The issue's ``--actor.adam.lr
  inf`` is refused at parse time elsewhere; an inf lr that reaches the optimizer is skipped, tested above.)
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from progpo.run.divergence import FiniteAdamW, SkipStreak, poison_nonfinite_loss
from progpo.run.metrics import SKIPPED_KEY
from progpo.run.settings import TrainSettings
from progpo.trainer.actor import Actor, ActorConfig
from progpo.trainer.settings import ActorSettings, AdamSettings, DeepSpeedSettings, KLSettings
from progpo.trainer.update import TrainSample, UpdateConfig, ppo_update, prepare


def test_finite_adamw_skips_nonfinite_gradients_and_lr_and_changes_nothing():
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = FiniteAdamW([p], lr=0.1, weight_decay=0.0)
    p.grad = torch.tensor([0.5, -0.5])
    opt.step()
    assert not opt.overflow
    assert p.detach().tolist() == pytest.approx([0.9, 2.1], abs=1e-6)  # first AdamW step: p - lr * g / |g|
    before = p.detach().clone()
    state = {k: v.clone() for k, v in opt.state[p].items()}
    for grad, lr in (([float("nan"), 1.0], 0.1), ([float("inf"), 1.0], 0.1), ([1.0, 1.0], float("inf"))):
        p.grad = torch.tensor(grad)
        opt.param_groups[0]["lr"] = lr
        opt.step()
        assert opt.overflow, (grad, lr)
        assert torch.equal(p.detach(), before)
        assert all(torch.equal(opt.state[p][k], v) for k, v in state.items())  # moments and step count kept
    opt.param_groups[0]["lr"] = 0.1
    p.grad = torch.tensor([1.0, 1.0])
    opt.step()
    assert not opt.overflow and float(opt.state[p]["step"]) == 2.0


def test_guard_gives_a_bare_optimizer_the_same_skip():
    from progpo.run.divergence import guard_optimizer

    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([p], lr=0.5)
    assert guard_optimizer(opt) and not guard_optimizer(opt) and not guard_optimizer(FiniteAdamW([p]))
    p.grad = torch.tensor([float("nan"), 1.0])
    opt.step()
    assert opt.overflow and p.detach().tolist() == [1.0, 2.0]
    p.grad = torch.tensor([2.0, -2.0])
    opt.step()
    assert not opt.overflow and p.detach().tolist() == [0.0, 3.0]  # SGD: p - lr * g


def test_nan_under_a_zero_mask_is_made_a_nan_gradient():
    x = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    mask = torch.tensor([1.0, 0.0])
    hidden_nan = torch.tensor([0.0, float("nan")])
    loss = (x * mask).sum() + (hidden_nan * mask).sum()  # NaN * 0 = NaN: the loss is NaN, its gradient is not
    assert math.isnan(float(loss.detach()))
    loss.backward(retain_graph=True)
    assert torch.isfinite(x.grad).all()  # an unguarded step would be applied
    x.grad = None
    poison_nonfinite_loss(loss).backward()
    assert torch.isnan(x.grad).all()
    finite = (x * mask).sum()
    assert poison_nonfinite_loss(finite) is finite


def test_skip_streak_counts_consecutive_skips_only():
    s = SkipStreak(limit=2)
    for applied in (False, True, False):
        s.record(applied)
    assert (s.streak, s.tripped, s.take_skipped(), s.skipped) == (1, False, 2, 0)
    s.record(False)
    assert s.tripped
    line = s.message(7, 1e30, "iter_000005")
    assert "\n" not in line and "iteration 7" in line and "--actor.adam.lr" in line and "iter_000005" in line


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_update_with_a_nan_advantage_is_skipped_then_the_next_applied(tiny_model, zero_stage):
    actor = Actor(ActorConfig(actor=ActorSettings(model_name_or_path=str(tiny_model), adam=AdamSettings(lr=1e-3)),
                              ds=DeepSpeedSettings(mixed_precision="off", zero_stage=zero_stage),
                              train=TrainSettings(micro_batch_size=1)))
    cfg = UpdateConfig(train=TrainSettings(batch_size=2, max_epochs=1), kl=KLSettings(init_coef=0.0))
    before = {k: v.clone() for k, v in actor.model.state_dict().items()}

    def update(advantages):
        samples = [TrainSample([5, 6, 7], [8, 9], advantages[0]), TrainSample([10, 11], [12], advantages[1])]
        return ppo_update(actor, prepare(actor, samples, cfg), cfg, np.random.default_rng(0))

    m = update([1.0, float("nan")])  # two micro-batches: the NaN one poisons the accumulated gradient
    assert (m[SKIPPED_KEY], m["loss/optimizer_steps"], actor.engine.skipped_steps) == (1.0, 0.0, 1)
    after = actor.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    m = update([1.0, -0.5])
    assert (m[SKIPPED_KEY], m["loss/optimizer_steps"], actor.engine.skipped_steps) == (0.0, 1.0, 1)
    after = actor.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values())


@pytest.mark.parametrize("lr", ["1e30", "inf"])
def test_diverging_run_exits_5_and_keeps_the_last_good_checkpoint(tiny_model, tmp_path, monkeypatch, capsys, lr):
    """``1e30``: iteration 1's step lands (huge finite weights), iteration 2's loss is NaN. ``inf``: the run starts at
    lr 1e-3 and its optimizer's lr is set to inf after iteration 1 (the CLI refuses inf itself)."""
    from safetensors.torch import load_file

    from progpo.cli.train import main
    from progpo.run.checkpoint import CheckpointManager
    from progpo.trainer.loop import Trainer

    weights: dict[int, dict[str, torch.Tensor]] = {}  # what each iteration ended with, as its checkpoint holds it
    log = Trainer.log

    def snapshot(self, it, metrics):
        weights[it] = {k: v.detach().cpu().clone() for k, v in self.actor.model.state_dict().items()}
        if lr == "inf":
            for group in self.actor.engine.optimizer.param_groups:  # ZeRO-0: the client AdamW itself
                group["lr"] = float("inf")
        return log(self, it, metrics)

    monkeypatch.setattr(Trainer, "log", snapshot)
    run = tmp_path / "run"
    rc = main(["--actor.model_name_or_path", "tiny", "--env.name", "alfworld_like", "--env.max_steps", "2",
               "--env.num_tasks", "4", "--rollout.batch_size", "1", "--rollout.n_samples_per_prompt", "2",
               "--rollout.max_new_tokens", "8", "--train.num_iterations", "4", "--train.batch_size", "64",
               "--train.micro_batch_size", "8", "--actor.adam.lr", "1e30" if lr == "1e30" else "1e-3",
               "--actor.entropy_coef", "0.01", "--train.max_nonfinite_skips", "2", "--logger.progress_bar", "false",
               "--logger.tensorboard_dir", "none", "--ckpt.path", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 5, err[-5:]
    assert err[-1].startswith("error: iteration 3: 2 consecutive optimizer steps skipped") and "--actor.adam.lr" in err[-1]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r[SKIPPED_KEY]) for r in records] == [(1, 0.0), (2, 1.0), (3, 1.0)]
    newest = CheckpointManager(run).latest()
    assert [p.name for p in CheckpointManager(run).complete()] == ["iter_000001"]
    assert (run / "checkpoints" / "latest").read_text() == "iter_000001"
    saved = load_file(str(newest / "hf" / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in saved.values())
    if lr == "1e30":
        assert max(float(t.abs().max()) for t in saved.values()) > 1e20  # iteration 1's step did land
    for it in (1, 2, 3):  # the skipped steps changed nothing: every iteration ended with iteration 1's weights
        assert all(torch.equal(weights[it][k], saved[k]) for k in saved), it


def test_no_checkpoint_is_written_from_nonfinite_weights(tmp_path):
    import contextlib
    from types import SimpleNamespace

    from progpo.run.checkpoint import CheckpointManager
    from progpo.run.divergence import NonFiniteUpdate

    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.bias[1] = float("inf")
    actor = SimpleNamespace(model=model, generation_context=contextlib.nullcontext)  # fails before any write
    mgr = CheckpointManager(tmp_path)
    kept = mgr.root / "iter_000001"
    kept.mkdir(parents=True)
    (kept / "trainer_state.json").write_text("{}")
    with pytest.raises(NonFiniteUpdate, match=r"^iteration 2: weight bias is not finite.*iter_000001.*--actor\.adam\.lr"):
        mgr.save(actor, 2, {}, np.random.default_rng(0))
    assert sorted(p.name for p in mgr.root.iterdir()) == ["iter_000001"]


def test_metrics_line_says_when_steps_were_skipped():
    from progpo.run.metrics import format_metrics

    assert "2 optimizer step(s) skipped: non-finite" in format_metrics(4, {SKIPPED_KEY: 2.0, "loss/policy": float("nan")})
    assert "skipped" not in format_metrics(4, {SKIPPED_KEY: 0.0, "loss/policy": 0.1})
