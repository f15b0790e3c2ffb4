"""Behaviour cloning (SFT) warm start on expert trajectories, through the DeepSpeed actor.

A sample is one expert step ``(prompt_ids, response_ids)`` produced by the RL episode loop
(``progpo.agents.experts``), so its prompt is exactly the RL prompt of that state. The loss is the
token-mean negative log-likelihood of the **response tokens only** (prompt tokens are masked, as in
the PPO update):

    L = - sum_{b, j} m_{b,j} log pi_theta(y_{b,j} | y_{b,<j}) / sum_{b, j} m_{b,j}

over one optimizer mini-batch (``m`` = action mask), accumulated over micro-batches exactly like
``progpo.trainer.update.ppo_update`` (same packing, same ``sequence_logprobs``, same
``token_sum``). Dimension names: ``B`` samples in a micro-batch, ``L`` padded token length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from progpo.agents.types import Episode
from progpo.run.logprobs import sequence_logprobs
from progpo.trainer.actor import Actor, pack_samples
from progpo.trainer.ppo import token_sum

Sample = tuple[list[int], list[int]]
"""``(prompt_ids [P], response_ids [R])`` of one expert step."""


def expert_samples(episodes: Sequence[Episode], keep_failed: bool = False) -> list[Sample]:
    """The training samples of expert episodes: one per step that followed the answer format.

    Episodes that failed (env died) are dropped, and so are the ones the expert lost unless
    ``keep_failed``; steps with an empty or format-invalid response (cut by the token limit) too.
    """
    out = []
    for ep in episodes:
        if ep.failed or not (ep.won or keep_failed):
            continue
        out.extend((list(s.prompt_ids), list(s.response_ids)) for s in ep.steps
                   if s.response_ids and not s.format_invalid)
    return out


def sft_token_loss(logprobs: torch.Tensor, mask: torch.Tensor, num_tokens: float) -> torch.Tensor:
    """Micro-batch share of the token-mean NLL: ``-sum(logprobs * mask) / num_tokens``.

    Args:
        logprobs: ``[B, L]`` log pi_theta of each token (0 where not scored).
        mask: ``[B, L]`` 1.0 on response tokens, 0.0 on prompt tokens and padding.
        num_tokens: response tokens in the whole optimizer mini-batch.

    Raises:
        ValueError: ``num_tokens`` <= 0 or shape mismatch (from ``token_sum``).
    """
    return -token_sum(logprobs, mask.to(logprobs.dtype), num_tokens)


def _micro_loss(actor: Actor, chunk: Sequence[Sample], num_tokens: float, model=None) -> torch.Tensor:
    t = {k: v.to(actor.device) for k, v in pack_samples(list(chunk), actor.tokenizer.pad_token_id).items()}
    with actor.precision.context():  # bf16 matmuls under mixed precision; log-probs and the loss are fp32
        lp, _ = sequence_logprobs(model if model is not None else actor.engine, t["input_ids"], t["attention_mask"],
                                  start=min(len(p) for p, _ in chunk))
    return sft_token_loss(lp, t["action_mask"], num_tokens)


def sft_epoch(actor: Actor, samples: Sequence[Sample], batch_size: int, rng: np.random.Generator,
              on_step: Callable[[float], None] | None = None) -> dict[str, float]:
    """One shuffled pass over ``samples``: mini-batches of ``batch_size``, micro-batches of the actor's size.

    Args:
        actor: the DeepSpeed actor (built with ``use_ref=False``). samples: expert steps.
        batch_size: samples per optimizer step. rng: shuffles the order.
        on_step: called with the mini-batch's mean NLL after each optimizer step (progress).

    Returns:
        ``loss/sft_nll`` (token-mean NLL averaged over optimizer steps, nats), ``loss/optimizer_steps``,
        ``loss/grad_norm`` (when DeepSpeed reports it).
    """
    engine = actor.engine
    engine.train()
    mb = actor.cfg.train.micro_batch_size
    order = rng.permutation(len(samples))
    losses, norms = [], []
    for start in range(0, len(order), batch_size):
        mini = [samples[i] for i in order[start:start + batch_size]]
        num_tokens = float(sum(len(r) for _, r in mini))
        if num_tokens == 0:
            continue
        micros = [mini[j:j + mb] for j in range(0, len(mini), mb)]
        total = 0.0
        for j, chunk in enumerate(micros):
            engine.set_gradient_accumulation_boundary(j == len(micros) - 1)
            loss = _micro_loss(actor, chunk, num_tokens)
            engine.backward(loss, scale_wrt_gas=False)
            engine.step()
            total += float(loss.detach())
        losses.append(total)
        norm = engine.get_global_grad_norm()
        if norm is not None:
            norms.append(float(norm))
        if on_step is not None:
            on_step(total)
    out = {"loss/sft_nll": float(np.mean(losses)) if losses else float("nan"), "loss/optimizer_steps": float(len(losses))}
    if norms:
        out["loss/grad_norm"] = float(np.mean(norms))
    return out


@torch.no_grad()
def mean_nll(actor: Actor, samples: Sequence[Sample]) -> float:
    """Token-mean NLL (nats per response token) of the current weights over ``samples`` (no update)."""
    if not samples:
        raise ValueError("mean_nll needs at least one sample")
    num_tokens = float(sum(len(r) for _, r in samples))
    was_training = actor.model.training
    actor.model.eval()
    try:
        mb = actor.cfg.train.micro_batch_size
        return float(sum(float(_micro_loss(actor, samples[i:i + mb], num_tokens, model=actor.model))
                         for i in range(0, len(samples), mb)))
    finally:
        actor.model.train(was_training)
