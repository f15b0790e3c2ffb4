"""Token-level losses for the critic-free PPO update (pure torch, no engine).

Dimension names: ``B`` samples (steps) in a micro-batch, ``L`` padded token length, ``V`` vocabulary.
Every tensor argument below is ``[B, L]`` and aligned token by token; ``mask`` is 1.0 on action
(response) tokens and 0.0 on prompt/observation tokens and padding, so only the tokens the policy
emitted carry loss.

Aggregation is *token-mean over the whole optimizer batch*: each micro-batch returns the sum of its
per-token terms divided by ``num_tokens``, the number of action tokens in the whole mini-batch, so
that accumulating micro-batch gradients gives exactly the token mean (DAPO, Yu et al. 2025, Eq. 8's
token-level normalisation).

The same math as OpenRLHF 0.11.2 (the cluster path), clamps included, so that one set of flags gives
one loss on both backends: ``ppo_clip_token_loss`` is ``openrlhf.models.loss.PolicyLoss``
(``policy_loss_type="ppo"``, log-ratio clamped to [-20, 20], optional dual clip), ``approx_kl`` is
``openrlhf.models.utils.compute_approx_kl`` (k1 / k2 / k3, value clamped to [-10, 10]) and ``token_sum`` is
``openrlhf.models.loss.aggregate_loss`` in token mode (the entropy, ``compute_entropy``, is
:func:`progpo.run.logprobs.entropy_from_logits`, which the OpenRLHF path's sync probe shares). OpenRLHF's own functions cannot be imported
on a CPU-only install (``openrlhf.models`` imports flash_attn), so these are ours, and
``tests/openrlhf/test_loss_parity.py`` compares values and gradients with OpenRLHF's on random and
extreme inputs (log-ratios -100..100, fp32 and bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")
LOG_RATIO_CLAMP = 20.0
"""PPO's ``log pi - log pi_old`` is clamped to +-this before ``exp`` (OpenRLHF ``PolicyLoss``)."""
KL_VALUE_CLAMP = 10.0
"""Every KL estimate is clamped to +-this (OpenRLHF ``compute_approx_kl``)."""


@dataclass(frozen=True)
class LossTerms:
    """The scalar loss of one micro-batch and its parts (all already divided by ``num_tokens``).

    Attributes:
        loss: ``policy + kl_coef * kl - entropy_coef * entropy`` (what is back-propagated).
        policy: PPO clipped surrogate part.
        kl: KL estimate to the reference policy (``approx_kl``; before ``kl_coef``).
        entropy: mean token entropy (before ``entropy_coef``; zero when no logits were given).
        clip_frac: share of action tokens whose ratio was clipped (sum; divide like the others).
        ratio: sum of ratios on action tokens (divided by ``num_tokens``).
    """

    loss: torch.Tensor
    policy: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor
    clip_frac: torch.Tensor
    ratio: torch.Tensor


def token_sum(x: torch.Tensor, mask: torch.Tensor, num_tokens: float) -> torch.Tensor:
    """``sum(x * mask) / num_tokens`` (token-mean contribution of one micro-batch).

    Raises:
        ValueError: ``num_tokens`` <= 0 or shapes differ.
    """
    if num_tokens <= 0:
        raise ValueError(f"num_tokens must be > 0, got {num_tokens}")
    if x.shape != mask.shape:
        raise ValueError(f"shape mismatch: values {tuple(x.shape)} vs mask {tuple(mask.shape)}")
    return (x * mask).sum() / num_tokens


def ppo_clip_token_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                        clip_eps_low: float = 0.2, clip_eps_high: float = 0.2,
                        dual_clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO clipped surrogate loss (Schulman et al. 2017, Eq. 7), negated for minimisation.

    ``l = -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)`` with
    ``rho = exp(clamp(logp - logp_old, -20, 20))``: the clamp keeps ``rho`` finite, so a token with a
    huge log-ratio and ``A = 0`` contributes 0 (not ``inf * 0 = NaN``) and no gradient. With
    ``dual_clip = c`` the loss of ``A < 0`` tokens is bounded by ``-c * A`` (dual-clip PPO, Ye et al.
    2020, Eq. 5): ``l = -max(min(rho A, clip(rho) A), c A)`` there.

    Args:
        logprobs: ``[B, L]`` log pi_theta(token) (nats), with grad.
        old_logprobs: ``[B, L]`` log pi_old(token) of the behaviour policy, no grad.
        advantages: ``[B, L]`` the step advantage broadcast to every token of the step's response.
        clip_eps_low, clip_eps_high: clip range (asymmetric as in DAPO when they differ).
        dual_clip: ``c > 1`` or None (off).

    Returns:
        ``(loss [B, L], clipped [B, L] float 0/1, ratio [B, L])``.

    Raises:
        ValueError: ``dual_clip`` is set and not > 1.
    """
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1.0 (or None), got {dual_clip}")
    ratio = (logprobs - old_logprobs).clamp(min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * advantages
    if dual_clip is None:
        loss = -torch.min(surr1, surr2)
    else:
        clip1 = torch.min(surr1, surr2)
        loss = -torch.where(advantages < 0, torch.max(clip1, dual_clip * advantages), clip1)
    clipped = torch.lt(surr2, surr1).float()
    return loss, clipped, ratio


def approx_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) on tokens sampled from the policy (Schulman 2020).

    With ``r = log pi_theta - log pi_ref`` (in fp32): ``k1 = r``; ``k2 = r^2 / 2``;
    ``k3 = exp(-r) - 1 + r`` with ``r`` first clamped to >= -10 (the GRPO KL loss, Shao et al. 2024,
    Eq. 4). Every value is then clamped to [-10, 10], as OpenRLHF does: a capped token has zero
    gradient (k3 at ``r = -10`` is 10, not 22015.5).

    Args:
        logprobs: ``[B, L]`` log pi_theta (with grad). ref_logprobs: ``[B, L]`` log pi_ref (no grad).
        estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (``--algo.kl.estimator``).

    Returns:
        ``[B, L]`` float32 estimates.

    Raises:
        ValueError: unknown ``estimator``.
    """
    log_ratio = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        value = log_ratio
    elif estimator == "k2":
        value = log_ratio**2 / 2.0
    elif estimator == "k3":
        r = log_ratio.clamp(min=-KL_VALUE_CLAMP)  # below -10 k3 exceeds the cap anyway; avoids inf * 0 in backward
        value = (-r).exp() - 1 + r
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")
    return value.clamp(min=-KL_VALUE_CLAMP, max=KL_VALUE_CLAMP)


def ppo_kl_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, num_tokens: float, *, ref_logprobs: torch.Tensor | None = None,
                kl_coef: float = 0.01, entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
                clip_eps_low: float = 0.2, clip_eps_high: float = 0.2, dual_clip: float | None = None,
                kl_estimator: str = "k3") -> LossTerms:
    """The micro-batch loss: token-mean PPO surrogate + ``kl_coef`` * KL - ``entropy_coef`` * H.

    As OpenRLHF's actor step with ``--algo.kl.use_loss`` (``policy_loss + kl_coef * kl_loss -
    entropy_coef * entropy_loss``, each aggregated by token mean).

    Args:
        logprobs, old_logprobs, advantages, mask: ``[B, L]`` (see module docstring).
        num_tokens: action tokens in the whole optimizer mini-batch (token-mean denominator).
        ref_logprobs: ``[B, L]`` reference-policy log-probs, or None (no KL term).
        kl_coef: weight of the KL loss (OpenRLHF ``--algo.kl.init_coef``; default 0.01).
        entropy: ``[B, L]`` token entropies (with grad) or None; entropy_coef: its bonus weight.
        clip_eps_low, clip_eps_high: PPO clip range. dual_clip: dual-clip bound (None = off).
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (see ``approx_kl``).

    Returns:
        ``LossTerms`` (scalars).

    Raises:
        ValueError: bad ``dual_clip``, ``kl_estimator`` or ``num_tokens``.
    """
    mask = mask.to(logprobs.dtype)
    tok_loss, clipped, ratio = ppo_clip_token_loss(logprobs, old_logprobs, advantages, clip_eps_low, clip_eps_high,
                                                   dual_clip)
    policy = token_sum(tok_loss, mask, num_tokens)
    zero = policy.new_zeros(())
    kl = token_sum(approx_kl(logprobs, ref_logprobs, kl_estimator), mask, num_tokens) if ref_logprobs is not None else zero
    ent = token_sum(entropy, mask, num_tokens) if entropy is not None else zero
    loss = policy + kl_coef * kl - entropy_coef * ent
    return LossTerms(loss=loss, policy=policy.detach(), kl=kl.detach(), entropy=ent.detach(),
                     clip_frac=token_sum(clipped, mask, num_tokens).detach(),
                     ratio=token_sum(ratio.detach(), mask, num_tokens))
