"""The update stage: PPO epochs over the rollout's step samples, through the DeepSpeed actor.

One ``TrainSample`` per step (one policy decision). Samples are put in a canonical order (so a
resumed run sees the same order as an uninterrupted one), shuffled with the run's seeded
generator, split into mini-batches of ``--train.batch_size`` samples (one optimizer step each) and
micro-batches of ``--train.micro_batch_size`` (gradient accumulation). Loss: ``progpo.trainer.ppo``.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from progpo.run.divergence import poison_nonfinite_loss
from progpo.run.logprobs import sequence_logprobs
from progpo.run.metrics import SKIPPED_KEY
from progpo.run.settings import RolloutSettings, TrainSettings
from progpo.trainer.actor import Actor, pack_samples
from progpo.trainer.ppo import LossTerms, ppo_kl_loss
from progpo.trainer.settings import ActorSettings, KLSettings


@dataclass
class TrainSample:
    """One step as a training sample.

    Attributes:
        prompt_ids: ``[P]`` prompt tokens (masked out of the loss).
        response_ids: ``[R]`` action tokens (the loss is on these only).
        advantage: the step's advantage (broadcast to its ``R`` tokens).
        old_logprobs: ``[R]`` behaviour log-probs of the update (None until :func:`prepare` or, for the
            samples of the first optimizer step, :func:`ppo_update` fills them).
        ref_logprobs: ``[R]`` reference log-probs, or None without a KL term (or until filled).
        rollout_logprobs: ``[R]`` log-probs the generator recorded when it sampled the response (None:
            not known); only measured against ``old_logprobs`` (:func:`rollout_mismatch`).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    rollout_logprobs: torch.Tensor | None = None

    def key(self) -> tuple[str, float]:
        """Canonical sort key: hash of the tokens, then the advantage."""
        h = hashlib.blake2b(np.asarray(self.prompt_ids + [-1] + self.response_ids, dtype=np.int64).tobytes(),
                            digest_size=8).hexdigest()
        return h, float(self.advantage)


@dataclass(frozen=True)
class UpdateConfig:
    """PPO update settings: the run's settings objects the update reads (no field of its own).

    Attributes:
        train: ``--train.*``: ``batch_size`` (samples per optimizer step), ``max_epochs`` (passes over the rollout).
        actor: ``--actor.*``: ``eps_clip_low_high`` (PPO clip range), ``dual_clip`` (dual-clip bound ``c > 1``
            for negative advantages; None = off), ``entropy_coef`` (entropy bonus weight).
        kl: ``--algo.kl.*``: ``init_coef`` (KL loss weight; 0 = no KL term) and ``estimator`` (k1, k2 or k3).
        rollout: ``--rollout.*``: ``temperature``, the sampling temperature the log-probs are computed at.
    """

    train: TrainSettings = field(default_factory=TrainSettings)
    actor: ActorSettings = field(default_factory=ActorSettings)
    kl: KLSettings = field(default_factory=KLSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether a training-mode forward of ``model`` is random: a dropout layer with ``p > 0`` (LoRA's
    ``--ds.lora.dropout`` included) or a config ``attention_dropout`` / ``hidden_dropout`` > 0."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    configs = [getattr(m, "config", None) for m in model.modules()]
    return any(float(getattr(c, k, 0.0) or 0.0) > 0 for c in configs if c is not None
               for k in ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop"))


def prepare(actor: Actor, samples: list[TrainSample], cfg: UpdateConfig, *, defer_behaviour: bool = True,
            policy_is_reference: bool = False) -> list[TrainSample]:
    """Canonical order, then the log-probs the loss compares with: ``old_logprobs`` and, with a KL term,
    ``ref_logprobs``.

    Args:
        actor: the policy. samples: the step samples. cfg: the update settings (temperature, KL).
        defer_behaviour: leave ``old_logprobs`` to :func:`ppo_update`, which computes them only for
            the samples after its first optimizer step and takes the others from that step's own forward
            pass (before any step they *are* the current policy's log-probs: one forward pass of
            ``batch_size`` samples saved, exactly). False, or a model with active dropout (its training
            forward pass is not the behaviour policy's): computed here for every sample.
        policy_is_reference: the policy still equals the KL reference, so ``ref_logprobs`` are the
            behaviour log-probs (no reference pass; filled with them, here or in :func:`ppo_update`).
    """
    samples = sorted(samples, key=TrainSample.key)
    for s in samples:
        s.old_logprobs = s.ref_logprobs = None
    pairs = [(s.prompt_ids, s.response_ids) for s in samples]
    if not defer_behaviour or has_dropout(actor.model):  # a training forward with dropout is not the behaviour policy
        defer_behaviour = False
        for s, lp in zip(samples, actor.logprobs(pairs, cfg.rollout.temperature)):
            s.old_logprobs = lp
    if cfg.kl.init_coef > 0 and actor.has_reference:
        if policy_is_reference:
            for s in samples:
                s.ref_logprobs = s.old_logprobs  # None when deferred: ppo_update copies them when known
        else:
            for s, lp in zip(samples, actor.logprobs(pairs, cfg.rollout.temperature, reference=True)):
                s.ref_logprobs = lp
    return samples


def _micro_tensors(chunk: list[TrainSample], pad_id: int) -> dict[str, torch.Tensor]:
    t = pack_samples([(s.prompt_ids, s.response_ids) for s in chunk], pad_id)
    shape = t["input_ids"].shape
    old = torch.zeros(shape)
    ref = torch.zeros(shape)
    adv = torch.zeros(shape)
    for k, s in enumerate(chunk):
        a, b = len(s.prompt_ids), len(s.prompt_ids) + len(s.response_ids)
        if s.old_logprobs is not None:
            old[k, a:b] = s.old_logprobs.cpu()
        if s.ref_logprobs is not None:
            ref[k, a:b] = s.ref_logprobs.cpu()
        adv[k, a:b] = float(s.advantage)
    t.update(old=old, ref=ref, adv=adv)
    return t


def num_micro_batches(n_samples: int, cfg: UpdateConfig, micro_batch_size: int) -> int:
    """Micro-batches (forward/backward passes) :func:`ppo_update` runs over ``n_samples`` samples."""
    per_epoch = sum(-(-min(cfg.train.batch_size, n_samples - s) // micro_batch_size)
                    for s in range(0, n_samples, cfg.train.batch_size))
    return cfg.train.max_epochs * per_epoch


def ppo_update(actor: Actor, samples: list[TrainSample], cfg: UpdateConfig, rng: np.random.Generator,
               on_micro_batch: Callable[[], None] | None = None, *, ref_follows_old: bool = False,
               on_optimizer_step: Callable[[bool], None] | None = None) -> dict[str, float]:
    """Run ``cfg.train.max_epochs`` PPO epochs over ``samples`` (already ``prepare``d).

    Behaviour log-probs that :func:`prepare` deferred (``old_logprobs`` None): before the first optimizer
    step the policy is the behaviour policy, so the samples of the first mini-batch take them from their
    own forward pass (detached; the ratio is exactly 1 there), and the others are computed up front,
    before that step. With ``ref_follows_old`` (the policy still equals the reference) the deferred
    samples' ``ref_logprobs`` are the same values.

    Args:
        actor: the DeepSpeed actor. samples: the rollout's step samples.
        cfg: update settings (``--train.max_epochs`` epochs of ``--train.batch_size`` mini-batches). rng: the run's generator (shuffles the mini-batches).
        on_micro_batch: called after each micro-batch's backward pass (progress; see :func:`num_micro_batches`).
        ref_follows_old: ``prepare(..., policy_is_reference=True)`` was used.
        on_optimizer_step: called after each optimizer step with whether it was applied (False: skipped for a
            non-finite loss, gradient norm or lr; :mod:`progpo.run.divergence`).

    Returns:
        Mean ``loss/*`` metrics over optimizer steps (policy, kl, entropy, clip_frac, ratio,
        grad_norm, total; a skipped step's non-finite values included), ``loss/optimizer_steps`` (steps applied),
        ``loss/update_skipped_nonfinite`` (steps skipped) and ``perf/logprobs_s`` (seconds of the up-front
        behaviour pass).

    Raises:
        RuntimeError: a sample without behaviour log-probs after the first optimizer step (a bug).
    """
    actor.engine.train()
    use_ref = cfg.kl.init_coef > 0 and all(s.ref_logprobs is not None or (ref_follows_old and s.old_logprobs is None)
                                           for s in samples)
    sums: dict[str, float] = defaultdict(float)
    n_steps = n_applied = 0
    logprobs_s = 0.0
    batch_size = cfg.train.batch_size
    for epoch in range(cfg.train.max_epochs):
        order = rng.permutation(len(samples))
        if epoch == 0:  # behaviour log-probs of the samples after the first step, before it is taken
            logprobs_s = _behaviour_logprobs([samples[i] for i in order[batch_size:]], actor, cfg, ref_follows_old)
        for start in range(0, len(order), batch_size):
            mini = [samples[i] for i in order[start:start + batch_size]]
            applied = _optimizer_step(actor, mini, cfg, sums, first=n_steps == 0, use_ref=use_ref,
                                      ref_follows_old=ref_follows_old, on_micro_batch=on_micro_batch)
            if applied is None:
                continue
            n_steps += 1
            n_applied += applied
            if on_optimizer_step is not None:
                on_optimizer_step(applied)
    out = {f"loss/{k if k != 'loss' else 'total'}": v / max(n_steps, 1) for k, v in sums.items()}
    out["loss/optimizer_steps"] = float(n_applied)
    out[SKIPPED_KEY] = float(n_steps - n_applied)
    out["perf/logprobs_s"] = logprobs_s
    return out


def _behaviour_logprobs(samples: list[TrainSample], actor: Actor, cfg: UpdateConfig, ref_follows_old: bool) -> float:
    """Fill the deferred ``old_logprobs`` (and, with ``ref_follows_old``, ``ref_logprobs``) of ``samples`` (those
    after the first optimizer step) with the current policy's log-probs; returns the seconds spent."""
    t0 = time.perf_counter()
    later = [s for s in samples if s.old_logprobs is None]
    if later:
        for s, lp in zip(later, actor.logprobs([(s.prompt_ids, s.response_ids) for s in later], cfg.rollout.temperature)):
            s.old_logprobs = lp
            if ref_follows_old:
                s.ref_logprobs = lp
    return time.perf_counter() - t0


def _optimizer_step(actor: Actor, mini: list[TrainSample], cfg: UpdateConfig, sums: dict[str, float], *, first: bool,
                    use_ref: bool, ref_follows_old: bool, on_micro_batch: Callable[[], None] | None) -> bool | None:
    """One optimizer step over the mini-batch ``mini`` (gradient accumulation over its micro-batches of
    ``--train.micro_batch_size``); adds each micro-batch's loss terms and the step's grad norm to ``sums``.

    A non-finite loss is backpropagated as a NaN gradient (:func:`progpo.run.divergence.poison_nonfinite_loss`), and
    a step whose gradient norm, gradients or lr are not finite is skipped by the optimizer (DeepSpeed's ZeRO/bf16
    optimizers, or the client :class:`~progpo.run.divergence.FiniteAdamW`): weights and optimizer state unchanged.

    Returns:
        None (no step taken) when ``mini`` holds no response token; else whether the step was applied.
    """
    num_tokens = float(sum(len(s.response_ids) for s in mini))
    if num_tokens == 0:
        return None
    engine = actor.engine
    mb = actor.cfg.train.micro_batch_size
    micros = [mini[j:j + mb] for j in range(0, len(mini), mb)]
    client = actor.optimizer_client
    for j, chunk in enumerate(micros):
        engine.set_gradient_accumulation_boundary(j == len(micros) - 1)
        terms = _micro_batch_terms(actor, chunk, cfg, num_tokens, first=first, use_ref=use_ref,
                                   ref_follows_old=ref_follows_old)
        engine.backward(poison_nonfinite_loss(terms.loss), scale_wrt_gas=False)
        client.overflow = False  # a ZeRO/bf16 wrapper that skips the step itself never calls the client's step
        engine.step()
        for name in ("loss", "policy", "kl", "entropy", "clip_frac", "ratio"):
            sums[name] += float(getattr(terms, name).detach())
        if on_micro_batch is not None:
            on_micro_batch()
    norm = engine.get_global_grad_norm()  # None when DeepSpeed did not compute it (ZeRO-0 path); inf when skipped
    if norm is not None:
        sums["grad_norm"] += float(norm)
    return engine.was_step_applied() and not client.overflow


def _micro_batch_terms(actor: Actor, chunk: list[TrainSample], cfg: UpdateConfig, num_tokens: float, *, first: bool,
                       use_ref: bool, ref_follows_old: bool) -> LossTerms:
    """The forward pass of one micro-batch and its PPO/KL/entropy loss terms (``progpo.trainer.ppo.ppo_kl_loss``,
    token sums divided by the mini-batch's ``num_tokens``). Samples whose behaviour log-probs were deferred take
    them from this very forward pass (detached), which is allowed only in the ``first`` optimizer step.

    Raises:
        RuntimeError: a sample without behaviour log-probs after the first optimizer step (a bug).
    """
    t = {k: v.to(actor.device) for k, v in _micro_tensors(chunk, actor.tokenizer.pad_token_id).items()}
    with actor.precision.context():  # bf16 matmuls under mixed precision; the backward runs outside
        lp, ent = sequence_logprobs(actor.engine, t["input_ids"], t["attention_mask"], cfg.rollout.temperature,
                                    with_entropy=cfg.actor.entropy_coef > 0, start=min(len(s.prompt_ids) for s in chunk))
    for k, s in enumerate(chunk):  # deferred behaviour log-probs: this very forward pass
        if s.old_logprobs is None:
            if not first:
                raise RuntimeError("a sample reached a later optimizer step without behaviour log-probs")
            a, b = len(s.prompt_ids), len(s.prompt_ids) + len(s.response_ids)
            s.old_logprobs = lp[k, a:b].detach().float().cpu()
            t["old"][k, a:b] = lp[k, a:b].detach()
            if ref_follows_old:
                s.ref_logprobs = s.old_logprobs
                t["ref"][k, a:b] = lp[k, a:b].detach()
    low, high = cfg.actor.eps_clip_low_high
    return ppo_kl_loss(lp, t["old"], t["adv"], t["action_mask"], num_tokens,
                       ref_logprobs=t["ref"] if use_ref else None, kl_coef=cfg.kl.init_coef,
                       entropy=ent, entropy_coef=cfg.actor.entropy_coef, clip_eps_low=low, clip_eps_high=high,
                       dual_clip=cfg.actor.dual_clip, kl_estimator=cfg.kl.estimator)


def rollout_mismatch(samples: list[TrainSample]) -> dict[str, float]:
    """How far the generator's recorded log-probs are from the trainer's behaviour log-probs of the same tokens.

    Per action token the importance ratio ``w = exp(old_logprobs - rollout_logprobs)`` (pi_train /
    pi_rollout, the ratio truncated importance sampling clips; Yao et al., "Your Efficient RL Framework
    Secretly Brings You Off-Policy RL Training", 2025); 1 when the two passes agree exactly. Samples
    without both log-probs are left out.

    Returns:
        ``rollout/ratio_dev_p50``, ``rollout/ratio_dev_p99``, ``rollout/ratio_dev_max``: median, 99th
        percentile and max of ``|w - 1|`` over the tokens; ``rollout/mismatch_kl``: the token mean of
        ``rollout_logprobs - old_logprobs`` (OpenRLHF 0.11.2's ``vllm_kl``). Empty when no sample has both.

    Raises:
        ValueError: a sample whose two log-prob tensors differ in length.
    """
    pairs = [(s.old_logprobs, s.rollout_logprobs) for s in samples
             if s.old_logprobs is not None and s.rollout_logprobs is not None]
    for old, roll in pairs:
        if old.shape != roll.shape:
            raise ValueError(f"rollout_logprobs has shape {tuple(roll.shape)} but old_logprobs {tuple(old.shape)}")
    if not pairs or not sum(old.numel() for old, _ in pairs):
        return {}
    diff = torch.cat([old.double().cpu() - roll.double().cpu() for old, roll in pairs])
    dev = (diff.exp() - 1).abs()
    return {"rollout/ratio_dev_p50": float(dev.quantile(0.5)), "rollout/ratio_dev_p99": float(dev.quantile(0.99)),
            "rollout/ratio_dev_max": float(dev.max()), "rollout/mismatch_kl": float(-diff.mean())}
