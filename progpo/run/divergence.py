"""Diverging updates never reach a checkpoint: a step whose loss or gradient norm is not finite is skipped (the
weights and optimizer state stay as they were), counted, and a run whose steps keep being skipped stops.

DeepSpeed 0.19.8 already skips such a step in its ZeRO-1/2/3 and bf16 optimizers: each computes the global
gradient norm, and an invalid one (``deepspeed.runtime.utils.is_invalid_grad_norm``: inf, NaN) sets the
optimizer's ``overflow`` flag; the engine's ``_take_model_step`` then leaves the lr schedule where it is, counts
the step in ``engine.skipped_steps`` and answers ``engine.was_step_applied()`` False. Its plain ZeRO-0 fp32 path
(the local backend's default) hands the step to the client optimizer unchecked: :class:`FiniteAdamW` is torch's
AdamW speaking the same ``overflow`` protocol, so that path skips by the same rule (:func:`guard_optimizer` gives
the same check to an optimizer built elsewhere, OpenRLHF's). A non-finite loss is made a
non-finite gradient (:func:`poison_nonfinite_loss`), so every optimizer skips it by its own gradient check.

Both backends count skipped steps in ``loss/update_skipped_nonfinite`` (:data:`progpo.run.metrics.SKIPPED_KEY`) and stop the run after
``--train.max_nonfinite_skips`` consecutive ones (:class:`SkipStreak`, :class:`NonFiniteUpdate`, exit status
:data:`EXIT_NONFINITE`); an iteration with a skipped step writes no checkpoint, and no checkpoint is written from
non-finite weights (:func:`first_nonfinite`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

EXIT_NONFINITE = 5
"""Exit status of ``train`` and ``train_ray`` when the run stopped on non-finite updates (:class:`NonFiniteUpdate`)."""


LR_FLAG = "--actor.adam.lr"
"""The flag a diverging run should lower (both backends spell it so)."""


class NonFiniteUpdate(RuntimeError):
    """The run stopped: too many consecutive optimizer steps had a non-finite loss or gradient norm, or the
    weights themselves are no longer finite. The message is one line naming the iteration and the flag to lower."""


class FiniteAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` that skips a step whose gradients or learning rate are not finite.

    DeepSpeed's optimizer protocol: ``overflow`` is True after a skipped ``step`` (the engine then counts it in
    ``skipped_steps``, reports ``was_step_applied()`` False and does not advance the lr schedule). A skipped step
    changes neither the parameters nor the optimizer state (moments, step count). Same constructor as AdamW.
    """

    overflow: bool = False

    @torch.no_grad()
    def step(self, closure=None):
        """AdamW's step, unless a gradient holds inf/NaN or a group's lr is not finite (then ``overflow`` = True)."""
        self.overflow = not step_finite(self.param_groups)
        if self.overflow:
            return None
        return super().step(closure)


def step_finite(param_groups: list[dict]) -> bool:
    """Whether a step over ``param_groups`` (an optimizer's) has finite gradients and learning rates."""
    grads = [p.grad for group in param_groups for p in group["params"] if p.grad is not None]
    return all(math.isfinite(float(group["lr"])) for group in param_groups) and tensors_finite(grads)


def guard_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    """Give a bare optimizer the check of :class:`FiniteAdamW`: its ``step`` is skipped, setting ``overflow``, when a
    gradient or lr is not finite. For an optimizer DeepSpeed steps unchecked (its ZeRO-0 fp32 path: the client or
    config optimizer itself, e.g. OpenRLHF's), and for the one inside DeepSpeed's ZeRO/bf16 wrappers (they check the
    gradient norm, not the lr). DeepSpeed's own ZeRO, bf16 and fp16 optimizers already have ``overflow`` and are
    left alone.

    Returns:
        Whether the optimizer was guarded here (False: it already speaks the ``overflow`` protocol).
    """
    if hasattr(optimizer, "overflow"):
        return False
    step = optimizer.step

    @torch.no_grad()
    def checked_step(*args, **kwargs):
        optimizer.overflow = not step_finite(optimizer.param_groups)
        return None if optimizer.overflow else step(*args, **kwargs)

    optimizer.overflow = False
    optimizer.step = checked_step
    return True


def tensors_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite (one host sync; True for none)."""
    flags = [torch.isfinite(t).all() for t in tensors]
    return bool(torch.stack(flags).all()) if flags else True


def poison_nonfinite_loss(loss: torch.Tensor) -> torch.Tensor:
    """``loss``, or where it is not finite ``loss * NaN``: its backward then gives every parameter on the loss's
    path a NaN gradient (NaN times a zero mask is NaN too), which every DeepSpeed optimizer and
    :class:`FiniteAdamW` skips. A NaN loss alone need not give a NaN gradient (a NaN under a zero mask has a
    zero derivative), so without this such a step could be applied."""
    return loss if bool(torch.isfinite(loss.detach()).all()) else loss * float("nan")


def first_nonfinite(state: Mapping[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor of ``state`` holding inf or NaN, or None."""
    return next((name for name, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())),
                None)


@dataclass
class SkipStreak:
    """Consecutive optimizer steps skipped for non-finite numbers, against the limit ``--train.max_nonfinite_skips``.

    Attributes:
        limit: the most consecutive skipped steps a run goes on after (it stops at ``limit``).
        streak: skipped steps since the last applied one.
        skipped: skipped steps since :meth:`take_skipped` last reset it (this iteration's count).
    """

    limit: int
    streak: int = 0
    skipped: int = 0

    def record(self, applied: bool) -> None:
        """One optimizer step: applied (the streak ends) or skipped."""
        if applied:
            self.streak = 0
        else:
            self.streak += 1
            self.skipped += 1

    def take_skipped(self) -> int:
        """Skipped steps since the last call, then reset to 0."""
        out, self.skipped = self.skipped, 0
        return out

    @property
    def tripped(self) -> bool:
        """The streak reached the limit: the run must stop."""
        return self.streak >= self.limit

    def message(self, iteration: int, lr: float, last_checkpoint: str | None) -> str:
        """The one line a stopped run prints."""
        kept = f"the newest checkpoint, {last_checkpoint}, holds the last good weights" if last_checkpoint else \
            "no checkpoint was written from a skipped step"
        return (f"iteration {iteration}: {self.streak} consecutive optimizer steps skipped for a non-finite loss or "
                f"gradient norm (--train.max_nonfinite_skips {self.limit}); the updates diverge: lower {LR_FLAG} "
                f"(now {lr:g}); {kept}")
