"""Rank-equal per-step rollout batches: every data-parallel rank runs the same collectives.

One sample per agent step makes the number of step samples ``S`` of a rollout batch change from
iteration to iteration. OpenRLHF 0.11.2 was written for a fixed count (prompts x samples):

* ``RemoteExperienceMaker.split_rollout_samples`` cuts the batch into chunks of
  ``--rollout.micro_batch_size`` rows and ``RayActorGroup.async_run_method_batch`` gives each rank
  ``ceil(M / ranks)`` of the ``M`` chunks (the last rank fewer): each chunk is one ZeRO-3 forward
  (parameter all-gathers) on the actor and on the reference;
* each policy rank trains on its rows with ``DataLoader(batch_size=--train.micro_batch_size,
  drop_last=True)`` and DeepSpeed steps the optimizer every ``gas`` micro-batches
  (``gas = --train.batch_size / (--train.micro_batch_size x ranks)``).

With arbitrary ``S`` the ranks would run different numbers of forward passes and micro-batches and
wait in an all-gather another rank never joins, and a trailing partial accumulation window would
carry its gradient into the next iteration. :func:`balance_for_ranks` therefore appends padding
rows until ``S`` is a multiple of :func:`rollout_multiple` ``L`` (= ``--train.batch_size`` under the
arithmetic :func:`check_batch_arithmetic` enforces), and orders the batch so that each policy rank's
contiguous share holds an equal number of real rows (real rows first, padding after).

A padding row is two padding tokens whose ``action_mask`` is all zero. It contributes exactly
nothing: OpenRLHF's losses are masked sums over action tokens divided by the optimizer window's
global action-token count (``aggregate_loss``), so a row without action tokens adds 0 to the
numerator and 0 to the denominator of the loss, and 0 to every gradient; the estimators never see
it (:func:`real_rows`); rollout statistics and training metrics leave it out
(``progpo.openrlhf.actors.StepActorPPOTrainer``). Because fewer than ``--train.batch_size``
padding rows are added, no optimizer window (``--train.batch_size`` rows over all ranks) consists of
padding only, so no window's token count is 0.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any

import torch
from openrlhf.trainer.ppo_utils.experience import Experience

PAD_LENGTH = 2
"""Tokens of a padding row (one prompt token, one masked response position)."""


def data_parallel_ranks(args: Any) -> tuple[int, int]:
    """``(policy ranks, forward ranks)`` of OpenRLHF's settings: its nested ``args`` (``args.ds.ring_attn_size``)
    or the flat flag mapping ``train_ray`` folds before OpenRLHF sees it (``ns["ds.ring_attn_size"]``).

    Policy ranks: the policy group's data-parallel size (``num_nodes x num_gpus_per_node`` over ring
    attention and tensor parallel sizes). Forward ranks: the least common multiple of that and the
    reference group's size (when a reference model runs, ``--algo.kl.init_coef > 0``).
    """
    get = args.__getitem__ if isinstance(args, Mapping) else (lambda key: operator.attrgetter(key)(args))
    dup = get("ds.ring_attn_size") * get("ds.tensor_parallel_size")
    actor = get("actor.num_nodes") * get("actor.num_gpus_per_node") // dup
    ref = get("ref.num_nodes") * get("ref.num_gpus_per_node") // dup if get("algo.kl.init_coef") > 0 else 1
    return actor, math.lcm(actor, ref)


def check_batch_arithmetic(*, train_batch: int, train_micro: int, rollout_micro: int, actor_ranks: int,
                           forward_ranks: int) -> int:
    """Check the batch sizes that keep per-step batches rank-equal; return the rollout multiple ``L``.

    Args:
        train_batch: ``--train.batch_size`` (step samples per optimizer step, all ranks).
        train_micro: ``--train.micro_batch_size`` (per rank and micro-batch).
        rollout_micro: ``--rollout.micro_batch_size`` (rows per forward chunk).
        actor_ranks, forward_ranks: from :func:`data_parallel_ranks`.

    Returns:
        ``L = --train.batch_size``: the multiple every per-step batch is padded to.

    Raises:
        ValueError: naming the flags, when ``train_batch`` is not a multiple of
            ``train_micro x actor_ranks`` (DeepSpeed's own rule, otherwise found only after start-up)
            or of ``rollout_micro x forward_ranks`` (then a padded batch could hold an optimizer
            window of padding only).
    """
    for name, value in (("--train.batch_size", train_batch), ("--train.micro_batch_size", train_micro),
                        ("--rollout.micro_batch_size", rollout_micro)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if train_batch % (train_micro * actor_ranks):
        raise ValueError(
            f"--train.batch_size {train_batch} must be a multiple of --train.micro_batch_size x policy ranks "
            f"({train_micro} x {actor_ranks}): DeepSpeed needs whole gradient-accumulation steps on every rank")
    if train_batch % (rollout_micro * forward_ranks):
        raise ValueError(
            f"--train.batch_size {train_batch} must be a multiple of --rollout.micro_batch_size x ranks "
            f"({rollout_micro} x {forward_ranks}, the policy and reference ranks' common multiple): per-step "
            f"batches are padded to a multiple of it so that every rank runs the same forward passes")
    return train_batch


def rollout_multiple(args: Any) -> int:
    """``L`` for OpenRLHF's nested ``args`` (see :func:`check_batch_arithmetic`, which raises)."""
    actor, forward = data_parallel_ranks(args)
    return check_batch_arithmetic(train_batch=args.train.batch_size, train_micro=args.train.micro_batch_size,
                                  rollout_micro=args.rollout.micro_batch_size, actor_ranks=actor,
                                  forward_ranks=forward)


def real_rows(experience: Experience) -> torch.Tensor:
    """``[B]`` bool: rows with at least one action token (padding rows have none)."""
    mask = experience.action_mask
    return mask.reshape(mask.shape[0], -1).sum(-1) > 0


def pad_row(template: Experience, pad_token_id: int) -> Experience:
    """One padding row shaped like the single-row ``template`` (same fields and info keys).

    ``sequences`` ``[1, 2]`` of ``pad_token_id`` (attended: a fully masked row would give NaN
    attention), ``action_mask`` ``[1, 1]`` of 0, zero rewards and lengths; every tensor entry of
    ``info`` becomes zeros of its shape, every list entry ``[""]`` (OpenRLHF concatenates rows
    key by key, so every row needs the same keys).
    """
    info: dict[str, Any] = {}
    for key, value in template.info.items():
        info[key] = torch.zeros_like(value) if isinstance(value, torch.Tensor) else [""] * len(value)
    action_mask = torch.zeros(1, PAD_LENGTH - 1, dtype=template.action_mask.dtype)
    logprobs = None if template.rollout_log_probs is None else torch.zeros(
        1, PAD_LENGTH - 1, dtype=template.rollout_log_probs.dtype)
    return Experience(
        sequences=torch.full((1, PAD_LENGTH), pad_token_id, dtype=template.sequences.dtype),
        attention_mask=torch.ones(1, PAD_LENGTH, dtype=template.attention_mask.dtype),
        action_mask=action_mask,
        rollout_log_probs=logprobs,
        prompts=[""],
        labels=[""],
        images=[None],
        mm_train_inputs=[None],
        rewards=torch.zeros_like(template.rewards),
        scores=None if template.scores is None else torch.zeros_like(template.scores),
        response_length=torch.zeros_like(template.response_length),
        truncated=torch.zeros_like(template.truncated),
        total_length=torch.full_like(template.total_length, float(PAD_LENGTH)),
        info=info,
    )


def balance_for_ranks(samples: list[Experience], *, multiple: int, ranks: int, pad_token_id: int) -> list[Experience]:
    """Pad single-row step samples to a multiple of ``multiple`` and give each rank an equal real share.

    Args:
        samples: ``[S]`` single-row experiences (real rows, in batch order), ``S >= 1``.
        multiple: ``L`` (:func:`rollout_multiple`); must be a multiple of ``ranks``.
        ranks: policy ranks; rank ``r`` receives rows ``[r P / ranks, (r + 1) P / ranks)`` of the result.
        pad_token_id: the tokenizer's padding id.

    Returns:
        ``[P]`` experiences, ``P = ceil(S / L) L``: rank ``r``'s share holds real rows
        ``S // ranks`` (+1 for the first ``S % ranks`` ranks), in batch order, then padding rows.

    Raises:
        ValueError: no samples, or ``multiple`` not a multiple of ``ranks``.
    """
    if not samples:
        raise ValueError("balance_for_ranks needs at least one step sample")
    if multiple % ranks:
        raise ValueError(f"rollout multiple {multiple} is not a multiple of the {ranks} ranks")
    total = math.ceil(len(samples) / multiple) * multiple
    share = total // ranks
    base, extra = divmod(len(samples), ranks)
    out: list[Experience] = []
    start = 0
    for r in range(ranks):
        n_real = base + (r < extra)
        out.extend(samples[start : start + n_real])
        out.extend(pad_row(samples[0], pad_token_id) for _ in range(share - n_real))  # own objects: OpenRLHF sets .index
        start += n_real
    return out
