"""PPO clipped surrogate, dual clip, KL estimators, entropy and token-mean on hand-computed tiny tensors.

Parity with OpenRLHF 0.11.2's functions on random and extreme inputs: ``tests/openrlhf/test_loss_parity.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from progpo.run.logprobs import entropy_from_logits
from progpo.trainer.ppo import approx_kl, ppo_clip_token_loss, ppo_kl_loss, token_sum


def test_clip_loss_hand_values():
    # ratios: e^0.5 = 1.6487 (clipped at 1.2 for A>0), e^-0.5 = 0.6065 (clipped at 0.8 for A<0: min picks 0.8*A? no)
    lp = torch.tensor([[0.5, -0.5, 0.0]])
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, clipped, ratio = ppo_clip_token_loss(lp, old, adv, 0.2, 0.2)
    # token 0: min(1.6487*1, 1.2*1) = 1.2 -> loss -1.2, clipped
    # token 1: min(0.6065*-1, 0.8*-1) = -0.8 -> loss 0.8, clipped
    # token 2: ratio 1 -> loss -2, not clipped
    assert torch.allclose(loss, torch.tensor([[-1.2, 0.8, -2.0]]), atol=1e-6)
    assert clipped.tolist() == [[1.0, 1.0, 0.0]]
    assert torch.allclose(ratio, torch.exp(lp))


def test_asymmetric_clip_range_hand_values():
    """eps_low = 0.1, eps_high = 0.3 (DAPO's clip-higher): ratios clip to [0.9, 1.3]; swapped they would
    clip to [0.7, 1.1] and every value below changes."""
    lp = torch.tensor([[0.5, -0.5, math.log(0.85), math.log(1.2)]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    loss, clipped, _ = ppo_clip_token_loss(lp, torch.zeros(1, 4), adv, clip_eps_low=0.1, clip_eps_high=0.3)
    # token 0: ratio 1.6487, A > 0: min(1.6487, 1.3) = 1.3 -> loss -1.3, clipped
    # token 1: ratio 0.6065, A < 0: min(-0.6065, -0.9) = -0.9 -> loss 0.9, clipped
    # token 2: ratio 0.85, A < 0: min(-0.85, -0.9) = -0.9 -> loss 0.9, clipped (in range if eps_low were 0.3)
    # token 3: ratio 1.2, A > 0: inside [0.9, 1.3] -> loss -1.2, not clipped (clipped at 1.1 if swapped)
    assert torch.allclose(loss, torch.tensor([[-1.3, 0.9, 0.9, -1.2]]), atol=1e-6)
    assert clipped.tolist() == [[1.0, 1.0, 1.0, 0.0]]
    terms = ppo_kl_loss(lp, torch.zeros(1, 4), adv, torch.ones(1, 4), 4, kl_coef=0.0,
                        clip_eps_low=0.1, clip_eps_high=0.3)
    assert terms.policy.item() == pytest.approx((-1.3 + 0.9 + 0.9 - 1.2) / 4)
    assert terms.clip_frac.item() == pytest.approx(0.75)


def test_clip_loss_unclipped_side_keeps_gradient():
    # A < 0 and ratio > 1 + eps: the unclipped (pessimistic) term is used, so the gradient is non-zero
    lp = torch.tensor([[0.5]], requires_grad=True)
    loss, clipped, _ = ppo_clip_token_loss(lp, torch.zeros(1, 1), torch.tensor([[-1.0]]))
    loss.sum().backward()
    assert clipped.item() == 0.0
    assert lp.grad.item() == pytest.approx(math.exp(0.5))  # d/dlp of -(e^lp * -1)


def test_k3_hand_values():
    lp = torch.tensor([[0.0, -1.0]])
    ref = torch.tensor([[0.0, -2.0]])
    k3 = approx_kl(lp, ref, "k3")
    d = -1.0
    assert k3[0, 0].item() == pytest.approx(0.0)
    assert k3[0, 1].item() == pytest.approx(math.exp(d) - d - 1)
    assert torch.all(approx_kl(torch.randn(4, 5), torch.randn(4, 5), "k3") >= 0)


def test_k1_k2_hand_values_and_unknown_estimator():
    lp = torch.tensor([[-1.0, -3.0]])
    ref = torch.tensor([[-2.0, -1.0]])
    assert approx_kl(lp, ref, "k1").tolist() == [[1.0, -2.0]]  # log pi - log pi_ref
    assert approx_kl(lp, ref, "k2").tolist() == [[0.5, 2.0]]  # (log pi - log pi_ref)^2 / 2
    with pytest.raises(ValueError, match="k4"):
        approx_kl(lp, ref, "k4")


def test_k3_is_capped_like_openrlhf():
    """Issue 12, case 2: k3 at log-ratio -10 is exp(10) - 11 = 22015.5 uncapped; OpenRLHF caps it at 10."""
    lp = torch.tensor([[-10.1]], requires_grad=True)
    k3 = approx_kl(lp, torch.tensor([[-0.1]]), "k3")
    k3.sum().backward()
    assert k3.item() == pytest.approx(10.0)
    assert lp.grad.item() == 0.0
    # every estimator's value is clamped to [-10, 10]
    big = torch.tensor([[50.0, -50.0]])
    for est in ("k1", "k2", "k3"):
        v = approx_kl(big, torch.zeros(1, 2), est)
        assert v.abs().max().item() <= 10.0


def test_huge_ratio_on_a_zero_advantage_token_contributes_nothing():
    """Issue 12, case 3: logp - old = 100 on a token with A = 0 gave NaN loss and NaN gradient."""
    lp = torch.tensor([[-0.5, -0.2]], requires_grad=True)
    old = torch.tensor([[-100.5, -0.2]])
    adv = torch.tensor([[0.0, 1.0]])
    for dual_clip in (None, 2.0):
        lp.grad = None
        t = ppo_kl_loss(lp, old, adv, torch.ones(1, 2), 2, kl_coef=0.0, dual_clip=dual_clip)
        t.loss.backward()
        assert t.loss.item() == pytest.approx(-0.5)
        assert lp.grad.tolist() == [[0.0, -0.5]]
        assert math.isfinite(t.ratio.item())


def test_dual_clip_bounds_negative_advantage_loss():
    # A = -1, ratio e^2 = 7.39 (> 1 + eps): plain PPO loss = 7.39; dual clip 3 caps it at 3 (Ye et al. 2020)
    lp = torch.tensor([[2.0, 2.0]])
    adv = torch.tensor([[-1.0, 1.0]])
    plain, _, _ = ppo_clip_token_loss(lp, torch.zeros(1, 2), adv)
    dual, _, _ = ppo_clip_token_loss(lp, torch.zeros(1, 2), adv, dual_clip=3.0)
    assert plain[0, 0].item() == pytest.approx(math.exp(2.0))
    assert dual[0, 0].item() == pytest.approx(3.0)
    assert dual[0, 1].item() == plain[0, 1].item() == pytest.approx(-1.2)  # A > 0: dual clip does not act
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_token_loss(lp, torch.zeros(1, 2), adv, dual_clip=1.0)


def test_token_mean_over_whole_minibatch_and_mask():
    lp = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    adv = torch.tensor([[5.0, 1.0, 1.0], [5.0, 3.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])  # column 0 = prompt token, masked
    terms = ppo_kl_loss(lp, lp.clone(), adv, mask, num_tokens=3, ref_logprobs=None)
    # ratio 1 everywhere: loss = -(1 + 1 + 3) / 3 (masked 5.0s ignored)
    assert terms.policy.item() == pytest.approx(-5.0 / 3)
    assert terms.kl.item() == 0.0
    # two micro-batches with the same denominator sum to the full-batch token mean
    a = ppo_kl_loss(lp[:1], lp[:1], adv[:1], mask[:1], num_tokens=3).loss
    b = ppo_kl_loss(lp[1:], lp[1:], adv[1:], mask[1:], num_tokens=3).loss
    assert (a + b).item() == pytest.approx(terms.loss.item())


def test_kl_and_entropy_terms_enter_total():
    lp = torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-2.0, -1.0]])
    mask = torch.ones(1, 2)
    ent = torch.tensor([[0.5, 1.5]])
    t = ppo_kl_loss(lp, lp, torch.zeros(1, 2), mask, 2, ref_logprobs=ref, kl_coef=0.1, entropy=ent, entropy_coef=0.01)
    kl = (math.exp(-1) + 1 - 1) / 2
    assert t.kl.item() == pytest.approx(kl)
    assert t.entropy.item() == pytest.approx(1.0)
    assert t.loss.item() == pytest.approx(0.0 + 0.1 * kl - 0.01 * 1.0)


def test_entropy_uniform_and_errors():
    assert entropy_from_logits(torch.zeros(1, 1, 4)).item() == pytest.approx(math.log(4))
    # two tokens, p = (e/(1+e), 1/(1+e)): H = -sum p log p
    p = math.e / (1 + math.e)
    h = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert entropy_from_logits(torch.tensor([[[1.0, 0.0]]])).item() == pytest.approx(h)
    with pytest.raises(ValueError, match="num_tokens"):
        token_sum(torch.ones(2), torch.ones(2), 0)
    with pytest.raises(ValueError, match="shape"):
        token_sum(torch.ones(2), torch.ones(3), 1)
