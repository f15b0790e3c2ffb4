"""Rank-equal per-step batches: padding rows add nothing to OpenRLHF's loss, gradients or metrics.

OpenRLHF 0.11.2's own ``ActorPPOTrainer.training_step`` and ``ppo_train`` run here in one process on
the tiny Qwen2 (fp32, no DeepSpeed: a one-rank strategy whose ``backward`` is ``loss.backward()``
and whose optimizer step leaves the gradients in place, so that they can be compared). Cost: ~2 s.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def mods(cpu_compat):
    with cpu_compat.import_shims():
        from openrlhf.models import Actor, PolicyLoss
        from openrlhf.trainer.ppo_utils.experience import Experience, make_experience_batch, split_experience_batch
        from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer
        from openrlhf.utils.loss_utils import _optimizer_step_loss_norm

        from progpo.openrlhf import actors, balance

        def batch(rows):  # a micro-batch as OpenRLHF's replay buffer collates it from single-row items
            return make_experience_batch([split_experience_batch(r)[0] for r in rows])

        return SimpleNamespace(Actor=Actor, PolicyLoss=PolicyLoss, Experience=Experience, batch=batch,
                               Theirs=ActorPPOTrainer, norm=_optimizer_step_loss_norm, actors=actors, balance=balance)


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    from progpo.run.tiny_model import tiny_model_path

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_path()), dtype=torch.float32, attn_implementation="sdpa")


class OneRank:
    """The strategy surface ``ActorPPOTrainer`` uses, for one process: autograd with DeepSpeed's loss
    scaling by ``1 / gas`` (OpenRLHF's loss normalisation pre-compensates it), no parameter update."""

    def __init__(self, args, gas):
        self.args, self.accumulated_gradient, self.ring_attn_group, self.optimizer_steps = args, gas, None, 0

    def backward(self, loss, model, optimizer):
        (loss / self.accumulated_gradient).backward()

    def optimizer_step(self, optimizer, model, scheduler, name="model"):
        self.optimizer_steps += 1

    def get_grad_norm(self, model):
        return 0.0

    def all_reduce(self, data, op="mean"):
        return data

    def is_rank_0(self):
        return True


def _args(micro, shuffle=False):
    return SimpleNamespace(
        actor=SimpleNamespace(eps_clip_low_high=(0.2, 0.2), dual_clip=None, loss_agg_mode="token-mean",
                              policy_loss_type="ppo", aux_loss_coef=0.0, entropy_coef=0.0),
        algo=SimpleNamespace(kl=SimpleNamespace(use_loss=True, init_coef=0.01, estimator="k3", unbiased_gradient=False),
                             advantage=SimpleNamespace(is_correction_level="off", is_correction_mode="mask",
                                                       is_correction_gating="ratio", is_correction_threshold=(0.5, 5.0))),
        train=SimpleNamespace(dynamic_batch_enable=False, async_enable=False, max_epochs=1, micro_batch_size=micro),
        ds=SimpleNamespace(tensor_parallel_size=1 if shuffle else 2, packing_samples=False),  # 2: OpenRLHF keeps order
    )


def _trainer(mods, model, cls, micro, gas):
    from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer

    args = _args(micro)
    t = cls.__new__(cls)
    actor = mods.Actor(model)
    actor.packing_samples = False
    t.strategy, t.args, t.actor, t.ema_model, t.aux_loss = OneRank(args, gas), args, actor, None, False
    t.actor_optim, t.actor_scheduler, t.max_epochs, t.dataloader_pin_memory = None, SimpleNamespace(
        get_last_lr=lambda: [1e-6]), 1, False
    t.actor_loss_fn = mods.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, token_level_loss=True)
    saved, torch.cuda.current_device = torch.cuda.current_device, lambda: 0
    try:
        t.replay_buffer = NaiveReplayBuffer(micro, 0, True, False, False)
    finally:
        torch.cuda.current_device = saved
    t.replay_buffer.target_device = torch.device("cpu")
    return t


def _row(mods, seed, prompt=5, response=4):
    """One single-row step experience as OpenRLHF's actor receives it (log-probs, advantages, info)."""
    g = torch.Generator().manual_seed(seed)
    n = prompt + response
    mask = torch.zeros(1, n - 1, dtype=torch.long)
    mask[0, prompt - 1:] = 1
    return mods.Experience(
        sequences=torch.randint(3, 900, (1, n), generator=g), attention_mask=torch.ones(1, n, dtype=torch.long),
        action_mask=mask, action_log_probs=-torch.rand(1, n - 1, generator=g) * mask,
        base_action_log_probs=-torch.rand(1, n - 1, generator=g) * mask,
        advantages=torch.randn(1, 1, generator=g) * mask.float(), returns=torch.zeros(1, n - 1),
        rewards=torch.randn(1, generator=g, dtype=torch.float64), scores=torch.zeros(1),
        response_length=torch.tensor([response]), truncated=torch.tensor([False]), total_length=torch.tensor([float(n)]),
        prompts=["p"], labels=["l"], images=[None], mm_train_inputs=[None],
        info={"reward": torch.randn(1, generator=g), "response_clip_ratio": torch.tensor([False])},
    )


def _pad(mods, like):
    pad = mods.balance.pad_row(like, pad_token_id=0)
    for name in ("action_log_probs", "base_action_log_probs", "advantages", "returns"):  # as make_experience sets them
        setattr(pad, name, torch.zeros(1, 1))
    return pad


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_a_padding_micro_batch_adds_exactly_nothing(mods, model):
    """Window of two micro-batches (gas 2): real rows, then padding only. The padding micro-batch's
    loss is exactly 0, it leaves every gradient bit-identical, and its metrics are finite zeros."""
    real = mods.batch([_row(mods, 1), _row(mods, 2, prompt=7)])
    pads = mods.batch([_pad(mods, _row(mods, 3)) for _ in range(2)])
    info = mods.norm([real.action_mask, pads.action_mask], None, 1, 2)
    t = _trainer(mods, model, mods.actors.StepActorPPOTrainer, micro=2, gas=2)
    model.zero_grad()
    t.training_step(real, 0.01, 0, info)
    after_real = _grads(model)
    status = t.training_step(pads, 0.01, 1, info)
    for name, g in _grads(model).items():
        assert torch.equal(g, after_real[name]), name
    assert float(status["metrics"]["policy_loss"]) == 0.0
    assert all(math.isfinite(float(v.float().mean())) for v in status["metrics"].values() if isinstance(v, torch.Tensor))
    assert status["num_action_tokens"] == status["num_samples"] == mods.actors.EMPTY_WEIGHT


def test_padding_rows_inside_a_micro_batch_change_neither_loss_nor_gradient(mods, model):
    rows = [_row(mods, 10), _row(mods, 11, prompt=9, response=6)]
    plain, padded = mods.batch(rows), mods.batch([rows[0], _pad(mods, rows[0]), rows[1], _pad(mods, rows[0])])
    t = _trainer(mods, model, mods.actors.StepActorPPOTrainer, micro=4, gas=1)
    results = []
    for mb in (plain, padded):
        model.zero_grad()
        status = t.training_step(mb, 0.01, 0, mods.norm([mb.action_mask], None, 1, 1))
        results.append((_grads(model), status))
    (g0, s0), (g1, s1) = results
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-6, atol=1e-9)
    for key in ("policy_loss", "kl", "ppo_clip_ratio", "reward", "response_length"):
        torch.testing.assert_close(s1["metrics"][key].float().mean(), s0["metrics"][key].float().mean())
    assert s1["num_samples"] == s0["num_samples"] == 2 and s1["num_action_tokens"] == s0["num_action_tokens"]


def test_ppo_train_over_a_padded_buffer_equals_the_unpadded_one(mods, model, monkeypatch):
    """OpenRLHF's own ``ppo_train`` (gas 4: one optimizer window): 6 real rows alone (3 micro-batches, a
    partial window), and the same 6 rows plus 2 padding rows that form a micro-batch of their own. Same
    accumulated gradient, same logged metrics; OpenRLHF's plain trainer divides 0 by 0 tokens on that
    padding micro-batch."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # ppo_train's .to() target
    rows = [_row(mods, 20 + i, prompt=4 + i % 3, response=3 + i % 2) for i in range(6)]
    out = {}
    for name, items in (("plain", rows), ("padded", rows + [_pad(mods, rows[0]), _pad(mods, rows[0])])):
        t = _trainer(mods, model, mods.actors.StepActorPPOTrainer, micro=2, gas=4)  # gas: the config's, not the data's
        for r in items:
            t.replay_buffer.append(r)
        model.zero_grad()
        status = t.ppo_train(0.01)
        out[name] = (_grads(model), status, t.strategy.optimizer_steps, t.progpo_micro_batches)
    (g0, s0, steps0, mb0), (g1, s1, steps1, mb1) = out["plain"], out["padded"]
    assert (mb0, mb1) == (3, 4)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-5, atol=1e-8)
    for key in s0:
        if key not in ("actor_grad_norm", "actor_lr"):
            assert math.isfinite(s1[key]), key
            assert s1[key] == pytest.approx(s0[key], rel=1e-5, abs=1e-7), key

    plain = _trainer(mods, model, mods.Theirs, micro=2, gas=4)
    for r in rows + [_pad(mods, rows[0]), _pad(mods, rows[0])]:
        plain.replay_buffer.append(r)
    with pytest.raises(ZeroDivisionError):
        plain.ppo_train(0.01)


def test_balance_gives_every_rank_the_same_rows_and_an_equal_real_share(mods):
    rows = [_row(mods, i) for i in range(13)]
    out = mods.balance.balance_for_ranks(rows, multiple=16, ranks=4, pad_token_id=0)
    assert len(out) == 16
    real = [bool(mods.balance.real_rows(e).item()) for e in out]
    assert [sum(real[r * 4:(r + 1) * 4]) for r in range(4)] == [4, 3, 3, 3]
    assert [e for e, k in zip(out, real) if k] == rows  # batch order kept
    assert len({id(e) for e in out}) == 16  # OpenRLHF writes each row's index into it
    with pytest.raises(ValueError, match="not a multiple of the 3 ranks"):
        mods.balance.balance_for_ranks(rows, multiple=16, ranks=3, pad_token_id=0)


@pytest.mark.parametrize("steps, multiple, ranks, rows, padding", [
    (16, 16, 2, 16, 0),    # already a whole multiple: no padding (a "+1 window" mutant gave 32 rows, 16 padding)
    (32, 16, 4, 32, 0),
    (256, 256, 8, 256, 0),  # the scripts' train batch on one node of 8 GPUs
    (17, 16, 2, 32, 15),
    (1, 16, 2, 16, 15),
    (15, 16, 2, 16, 1),
])
def test_balance_pads_to_the_next_multiple_only(mods, steps, multiple, ranks, rows, padding):
    out = mods.balance.balance_for_ranks([_row(mods, 0)] * steps, multiple=multiple, ranks=ranks, pad_token_id=0)
    real = [bool(mods.balance.real_rows(e).item()) for e in out]
    assert (len(out), real.count(False)) == (rows, padding)


@settings(max_examples=200, deadline=None)
@given(ranks=st.sampled_from([1, 2, 3, 4, 8, 16]), per_rank=st.integers(1, 16), steps=st.integers(1, 300))
def test_no_optimizer_window_is_padding_only(mods, ranks, per_rank, steps):
    """For any step count S, ranks and train batch L (a multiple of the ranks): ``ceil(S / L) L`` rows,
    fewer than L of them padding, and every optimizer window (L rows: L / ranks consecutive rows of each
    rank's share) holds a real row -- in batch order, and in any order a rank's loader shuffles its share into
    (some rank has more real rows than all its windows but one can hold)."""
    multiple = ranks * per_rank
    out = mods.balance.balance_for_ranks([_row(mods, 0)] * steps, multiple=multiple, ranks=ranks, pad_token_id=0)
    real = [bool(mods.balance.real_rows(e).item()) for e in out]
    windows = -(-steps // multiple)
    assert len(out) == windows * multiple and sum(real) == steps and real.count(False) < multiple
    shares = [real[r * windows * per_rank:(r + 1) * windows * per_rank] for r in range(ranks)]
    for w in range(windows):
        assert any(any(share[w * per_rank:(w + 1) * per_rank]) for share in shares), (w, shares)
    assert max(sum(share) for share in shares) > (windows - 1) * per_rank  # whatever the shuffle


@pytest.mark.parametrize("kwargs, flag", [
    ({"train_batch": 256, "train_micro": 8, "rollout_micro": 16, "actor_ranks": 32, "forward_ranks": 32},
     "--rollout.micro_batch_size x ranks"),
    ({"train_batch": 256, "train_micro": 3, "rollout_micro": 16, "actor_ranks": 8, "forward_ranks": 8},
     "--train.micro_batch_size x policy ranks"),
])
def test_batch_arithmetic_is_checked_naming_the_flags(mods, kwargs, flag):
    with pytest.raises(ValueError, match=flag.replace(".", r"\.")):
        mods.balance.check_batch_arithmetic(**kwargs)
    ok = dict(kwargs, rollout_micro=8, train_micro=8)
    assert mods.balance.check_batch_arithmetic(**ok) == 256


class _Rank:
    """A policy/reference rank as OpenRLHF's ``RayActorGroup`` sees it: records what each call hands it."""

    def __init__(self):
        self.calls = []
        self.execute_batch = SimpleNamespace(remote=lambda method, chunk, start, end: self.calls.append(
            (method, chunk, end - start)))


def _rank_counts(mods, rows, *, ranks, rollout_micro, train_micro, gas, monkeypatch):
    """Forward passes, micro-batches and pending accumulation steps per rank, by OpenRLHF's own code:
    ``split_rollout_samples`` (experience maker) and ``RayActorGroup.async_run_method_batch`` (chunking),
    then ``DataLoader(drop_last=True)`` micro-batches and DeepSpeed's every-``gas`` optimizer step."""
    import ray
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ray.launcher import RayActorGroup

    monkeypatch.setattr(ray, "put", lambda value: value)
    maker = RemoteExperienceMaker.__new__(RemoteExperienceMaker)
    maker.args = SimpleNamespace(train=SimpleNamespace(dynamic_batch_enable=False),
                                 rollout=SimpleNamespace(micro_batch_size=rollout_micro))
    maker.tokenizer = SimpleNamespace(pad_token_id=0)
    chunks = maker.split_rollout_samples(rows)
    group = RayActorGroup.__new__(RayActorGroup)
    group._actor_handlers, group.duplicate_actors = [_Rank() for _ in range(ranks)], 1
    group.async_run_method_batch(method_name="forward", sequences=[c.sequences for c in chunks])
    group.async_run_method_batch(method_name="append", experience=chunks)
    out = []
    for rank in group._actor_handlers:
        forward = sum(n for method, _, n in rank.calls if method == "forward")
        rows_here = sum(e.sequences.size(0) for method, chunk, _ in rank.calls if method == "append"
                        for e in chunk["experience"])
        micro = rows_here // train_micro
        out.append((forward, micro, micro // gas, micro % gas))
    return out


@pytest.mark.parametrize("ranks, rollout_micro, train_batch, train_micro", [
    (8, 16, 256, 8),   # one node of 8 GPUs: the scripts' arithmetic
    (16, 8, 256, 8),   # two nodes
    (2, 4, 16, 2),     # the CPU topology run
])
def test_every_rank_runs_the_same_collectives_whatever_the_step_count(mods, monkeypatch, ranks, rollout_micro,
                                                                      train_batch, train_micro):
    """For every S (the step count of a rollout): equal forward passes (policy and reference share the
    chunking), equal micro-batches and whole optimizer steps on every rank, nothing left pending."""
    gas = train_batch // (train_micro * ranks)
    template = _row(mods, 0)
    for name in ("action_log_probs", "base_action_log_probs", "advantages", "returns"):  # set later, by the forwards
        setattr(template, name, None)
    seen_unequal = False
    for s in (1, 3, ranks + 1, 21, 127, 129, 300, 511):
        rows = [template] * s
        try:
            plain = _rank_counts(mods, rows, ranks=ranks, rollout_micro=rollout_micro, train_micro=train_micro,
                                 gas=gas, monkeypatch=monkeypatch)
            seen_unequal |= len(set(plain)) > 1 or any(c[3] for c in plain)
        except ValueError:  # OpenRLHF: fewer chunks than ranks
            seen_unequal = True
        balanced = mods.balance.balance_for_ranks(rows, multiple=train_batch, ranks=ranks, pad_token_id=0)
        counts = _rank_counts(mods, balanced, ranks=ranks, rollout_micro=rollout_micro, train_micro=train_micro,
                              gas=gas, monkeypatch=monkeypatch)
        assert len(set(counts)) == 1, (s, counts)
        assert counts[0][3] == 0 and counts[0][2] >= 1, (s, counts)  # no gradient carried to the next iteration
    assert seen_unequal  # without the padding, OpenRLHF's chunking gives ranks different work
