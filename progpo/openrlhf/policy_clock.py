"""The policy version of every step sample, and what the trainer logs of it (sync and async mode).

OpenRLHF's async mode (``--train.async_enable``) generates the next rollout batch while the current one trains,
so a batch can be trained on by a policy some weight syncs newer than the one that sampled it; with
``--train.partial_rollout_enable`` a sync may even fall inside a request (vLLM pauses and resumes it). To say
which weights sampled what, one :class:`PolicyClock` actor per job counts the weight syncs: the trainer
advances it after each ``broadcast_to_vllm`` (inside OpenRLHF's pause/resume or lock), and the agent executor
(:class:`progpo.openrlhf.agent.EngineGenerate`, in the engine's process) reads it before and after every
request. Each step sample then carries ``policy_version`` (the version when its request was sent) and
``policy_version_end`` (when it returned), and the trainer logs, per batch (:func:`version_metrics`):

* ``async/version_lag_mean``, ``async/version_lag_max``: the trainer's version at the update minus each step's
  ``policy_version`` (0 in sync mode; at most ``--train.async_queue_size`` in async mode without partial
  rollout, where a batch is generated under OpenRLHF's lock, one version throughout);
* ``async/mixed_version_groups``: groups (all rollouts of one task, one uid) whose steps were not all sampled
  under one version (only partial rollout makes them). Such a group is **kept and corrected**: every token's
  behaviour log-prob is the one vLLM sampled it with, under whichever weights were loaded at that moment, and
  OpenRLHF's importance-sampling correction (``--algo.advantage.is_correction_*``, which ``train_ray`` turns on
  by default and requires with partial rollout) reweights each token by ``pi_old / pi_behaviour``. Its
  advantages are computed on the group whole, as any other.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

CLOCK_NAME = "progpo_policy_clock"
"""Ray name of the job's :class:`PolicyClock` (named actors live in the job's namespace: one per job)."""

LAG_MEAN, LAG_MAX, MIXED_GROUPS = "async/version_lag_mean", "async/version_lag_max", "async/mixed_version_groups"
UNRECORDED = -1
"""``policy_version`` of a step whose engine ran no clock (the local backend; a clock that could not be reached)."""


class PolicyClock:
    """Counts the weight syncs of one job (the policy version the engines hold: 0 before the first sync).

    Used as a Ray actor (:func:`policy_clock`); plain methods so that tests can use it directly.
    """

    def __init__(self) -> None:
        self._version = 0

    def version(self) -> int:
        """The number of completed weight syncs."""
        return self._version

    def advance(self) -> int:
        """One more weight sync completed; returns the new version."""
        self._version += 1
        return self._version


def policy_clock(create: bool = False) -> Any:
    """The job's :class:`PolicyClock` actor handle (``ray.get_actor`` of :data:`CLOCK_NAME`), created when
    ``create`` (the trainer does, before any rollout); None where none runs and ``create`` is false.

    Requires a connected Ray (``ray.is_initialized()``); returns None otherwise.
    """
    import ray

    if not ray.is_initialized():
        return None
    if create:
        return ray.remote(num_cpus=0)(PolicyClock).options(name=CLOCK_NAME, get_if_exists=True).remote()
    try:
        return ray.get_actor(CLOCK_NAME)
    except ValueError:
        return None


async def read_version(clock: Any) -> int:
    """``await clock.version``: the engines' weight version now (:data:`UNRECORDED` when ``clock`` is None)."""
    if clock is None:
        return UNRECORDED
    return int(await clock.version.remote())


def version_metrics(trainer_version: int, uids: Sequence[str], versions: Sequence[int],
                    versions_end: Sequence[int]) -> dict[str, float]:
    """Per-batch version figures of step samples (see module doc).

    Args:
        trainer_version: weight syncs the trainer completed before this update (the version it trains from).
        uids: ``[S]`` group id of each step sample.
        versions, versions_end: ``[S]`` each step's ``policy_version`` / ``policy_version_end``
            (:data:`UNRECORDED` steps are left out of every figure).

    Returns:
        ``async/version_lag_mean`` and ``async/version_lag_max`` (in weight syncs, over the recorded steps;
        absent when none is recorded) and ``async/mixed_version_groups`` (count of uids whose recorded steps
        span more than one version).

    Raises:
        ValueError: the three sequences differ in length, or a version is newer than ``trainer_version`` (a
            step cannot have been sampled by weights the trainer has not produced yet).
    """
    if not len(uids) == len(versions) == len(versions_end):
        raise ValueError(f"uids, versions and versions_end differ in length: {len(uids)}, {len(versions)}, "
                         f"{len(versions_end)}")
    start, end = np.asarray(versions, dtype=np.int64), np.asarray(versions_end, dtype=np.int64)
    known = (start != UNRECORDED) & (end != UNRECORDED)
    out: dict[str, float] = {MIXED_GROUPS: float(len(mixed_version_groups(
        [u for u, k in zip(uids, known) if k], start[known], end[known])))}
    if known.any():
        if int(end[known].max()) > trainer_version:
            raise ValueError(f"a step sampled under policy version {int(end[known].max())}, newer than the trainer's "
                             f"{trainer_version}")
        lag = trainer_version - start[known]
        out.update({LAG_MEAN: float(lag.mean()), LAG_MAX: float(lag.max())})
    return out


def mixed_version_groups(uids: Sequence[str], versions: Iterable[int], versions_end: Iterable[int]) -> list[str]:
    """The uids whose steps were not all sampled under one version (a step's own ``start != end`` counts: a
    sync fell inside its request). ``uids``, ``versions``, ``versions_end``: ``[S]``."""
    seen: dict[str, set[int]] = {}
    for uid, a, b in zip(uids, versions, versions_end):
        seen.setdefault(uid, set()).update((int(a), int(b)))
    return sorted(uid for uid, vs in seen.items() if len(vs) > 1)


def overlap_seconds(first: Sequence[tuple[float, float]], second: Sequence[tuple[float, float]]) -> float:
    """Seconds during which some interval of ``first`` and some interval of ``second`` both run.

    Args:
        first, second: ``(start, end)`` wall-clock intervals (seconds), each list possibly overlapping itself.

    Returns:
        The length of (union of ``first``) intersected with (union of ``second``).
    """

    def union(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
        merged: list[list[float]] = []
        for a, b in sorted((float(a), float(b)) for a, b in spans if b > a):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return [(a, b) for a, b in merged]

    total, xs, ys = 0.0, union(first), union(second)
    i = j = 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total
