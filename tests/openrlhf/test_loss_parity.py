"""The local backend's loss math is OpenRLHF 0.11.2's, value for value and gradient for gradient.

``progpo.trainer.ppo`` and ``progpo.run.logprobs`` cannot import OpenRLHF's functions on a CPU-only install
(``openrlhf.models`` imports flash_attn), so they keep their own; these tests import OpenRLHF's under the cpu_compat import shims and
compare on random and extreme inputs (log-ratios from -100 to 100, fp32 and bf16): the PPO policy
loss (clip, asymmetric clip, dual clip), the KL estimators k1/k2/k3, entropy, token-mean
aggregation, per-token log-probs, and the whole actor loss as OpenRLHF's actor step assembles it
(``policy + kl_coef * kl - entropy_coef * entropy``). Issue 12, cases 2-3.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from progpo.run.logprobs import entropy_from_logits, sequence_logprobs
from progpo.trainer.ppo import approx_kl, ppo_clip_token_loss, ppo_kl_loss, token_sum


@pytest.fixture(scope="module")
def orl(cpu_compat):
    with cpu_compat.import_shims():
        from openrlhf.models import loss, utils

    return SimpleNamespace(
        PolicyLoss=loss.PolicyLoss, aggregate_loss=loss.aggregate_loss,
        compute_approx_kl=utils.compute_approx_kl, log_probs_from_logits=utils.log_probs_from_logits,
        # compute_entropy is @torch.compile'd; its eager body is the same function without a C++ build
        compute_entropy=utils.compute_entropy._torchdynamo_orig_callable,
    )


def _inputs(dtype, seed=0, b=4, length=64):
    """logp, old, ref, adv, mask [b, length]: log-ratios spanning -100..100 plus random ones."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, length, generator=g) * 5
    d = torch.linspace(-100, 100, b * length).reshape(b, length)
    d = torch.where(torch.rand(b, length, generator=g) < 0.5, d, torch.randn(b, length, generator=g) * 0.3)
    logp = old + d
    ref = old + torch.randn(b, length, generator=g) * torch.tensor([0.1, 1.0, 10.0, 100.0])[:, None]
    adv = torch.randn(b, length, generator=g) * 2
    adv[torch.rand(b, length, generator=g) < 0.2] = 0.0
    mask = (torch.rand(b, length, generator=g) < 0.8).float()
    return [t.to(dtype) for t in (logp, old, ref, adv, mask)]


def _leaf(x):
    return x.detach().clone().requires_grad_(True)


def _assert_same(ours, theirs, what):
    assert torch.isfinite(ours).all(), f"{what}: ours not finite"
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0, msg=f"{what} differs from OpenRLHF's")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("clip, dual_clip", [((0.2, 0.2), None), ((0.2, 0.28), None), ((0.2, 0.2), 3.0)])
def test_policy_loss_matches_openrlhf(orl, dtype, clip, dual_clip):
    logp, old, _, adv, mask = _inputs(dtype)
    n = float(mask.sum())
    a, b = _leaf(logp), _leaf(logp)
    tok, clipped, _ = ppo_clip_token_loss(a, old, adv, *clip, dual_clip=dual_clip)
    ours = token_sum(tok, mask, n)
    fn = orl.PolicyLoss(clip_eps_low=clip[0], clip_eps_high=clip[1], dual_clip=dual_clip)
    theirs, clip_ratio, *_ = fn(b, old, adv, action_mask=mask, batch_num_tokens=n)
    ours.backward()
    theirs.backward()
    _assert_same(ours, theirs, "policy loss")
    _assert_same(a.grad, b.grad, "policy loss gradient")
    _assert_same(token_sum(clipped, mask, n), clip_ratio, "clip fraction")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_match_openrlhf(orl, dtype, estimator):
    logp, _, ref, _, mask = _inputs(dtype, seed=1)
    a, b = _leaf(logp), _leaf(logp)
    ours = approx_kl(a, ref, estimator)
    theirs = orl.compute_approx_kl(b, ref, kl_estimator=estimator)
    _assert_same(ours, theirs, f"{estimator} value")
    (ours * mask).sum().backward()
    (theirs * mask).sum().backward()
    _assert_same(a.grad, b.grad, f"{estimator} gradient")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entropy_and_logprobs_match_openrlhf(orl, dtype):
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(3, 12, 50, generator=g) * torch.tensor([1.0, 10.0, 100.0])[:, None, None]).to(dtype)
    ids = torch.randint(0, 50, (3, 12), generator=g)
    a, b = _leaf(logits), _leaf(logits)
    ours, theirs = entropy_from_logits(a), orl.compute_entropy(b.float())
    _assert_same(ours, theirs, "entropy")
    ours.sum().backward()
    theirs.sum().backward()
    _assert_same(a.grad, b.grad, "entropy gradient")
    # per-token log-probs and entropy as the update computes them (temperature-scaled fp32 logits)
    temperature = 0.7
    model = lambda **kw: SimpleNamespace(logits=logits[:, -kw["logits_to_keep"]:])  # noqa: E731
    lp, ent = sequence_logprobs(model, ids, torch.ones_like(ids), temperature, with_entropy=True, start=1)
    scaled = logits.float()[:, :-1] / temperature
    torch.testing.assert_close(lp[:, 1:], orl.log_probs_from_logits(scaled.clone(), ids[:, 1:]), rtol=0, atol=2e-5)
    _assert_same(ent[:, 1:], orl.compute_entropy(scaled), "entropy in sequence_logprobs")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_whole_actor_loss_matches_openrlhf(orl, dtype, estimator):
    """``ppo_kl_loss`` = OpenRLHF's actor step: policy + kl_coef * kl - entropy_coef * entropy, token mean."""
    logp, old, ref, adv, mask = _inputs(dtype, seed=3)
    ent = torch.rand(logp.shape, generator=torch.Generator().manual_seed(4)).to(dtype) * 3
    n = float(mask.sum()) + 7.0  # the denominator counts the whole mini-batch, not this micro-batch
    kl_coef, ent_coef = 0.05, 0.01
    a, b = _leaf(logp), _leaf(logp)
    ours = ppo_kl_loss(a, old, adv, mask, n, ref_logprobs=ref, kl_coef=kl_coef, entropy=ent,
                       entropy_coef=ent_coef, clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=3.0,
                       kl_estimator=estimator)
    policy, *_ = orl.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=3.0)(
        b, old, adv, action_mask=mask, batch_num_tokens=n)
    kl = orl.aggregate_loss(orl.compute_approx_kl(b, ref, kl_estimator=estimator), mask, batch_num_tokens=n)
    theirs = policy + kl * kl_coef - orl.aggregate_loss(ent, mask, batch_num_tokens=n) * ent_coef
    ours.loss.backward()
    theirs.backward()
    _assert_same(ours.loss, theirs, "actor loss")
    _assert_same(a.grad, b.grad, "actor loss gradient")
    _assert_same(ours.kl, kl.detach(), "kl term")
