"""The text-environment protocol shared by WebShop and ALFWorld (Gymnasium-like).

Every environment is a turn-based text game:

* ``reset(*, split, index=None, seed=None) -> (observation, info)`` starts the task ``index`` of
  ``split`` (or one chosen deterministically from ``seed``). The same (split, index) always gives
  the same initial state, so the N members of a group play the same task.
* ``step(action) -> StepResult`` never raises for a bad action: an invalid or inadmissible action
  returns the game's own answer, reward 0 (the trainer subtracts the invalid-action penalty),
  and ``info["invalid_action"] = True``.
* ``terminated`` (the task ended: success or failure) and ``truncated`` (the step limit was hit)
  are kept apart, as in Gymnasium.

Required ``info`` keys after ``reset`` and every ``step`` (the conformance checker in
``progpo.envs.conformance`` tests them):

==================== ======== ===============================================================
key                  type     meaning
==================== ======== ===============================================================
``task``             str      the instruction text the agent must fulfil
``task_id``          str      stable id of the task (ALFWorld game path, WebShop goal index)
``anchor_observation`` str    the raw observation (no template, history or action list);
                              GiGPO's anchor state
``admissible_actions`` list[str] the actions the env accepts now (may be empty)
``won``              bool     True once the task is solved
``invalid_action``   bool     the last action was malformed or inadmissible (False after reset)
==================== ======== ===============================================================

Optional key ``state_extra`` (str): state that matters but that ``anchor_observation`` does not show
(ALFWorld: the inventory; WebShop: the options chosen on the current item). The episode loop records it
as ``StepRecord.state_extra``; estimators with ``state_key = obs_inventory`` key states on it.

Env-specific keys may be added (ALFWorld: ``task_type``, ``inventory``; WebShop:
``reward_breakdown``).

Actions are compared after one normalisation, :func:`normalize_action`: the agent's parser applies
it to the model's action (``progpo.agents.parsing``), and every env applies the same function to
the labels it matches an action against (WebShop's clickables, ALFWorld's admissible commands), so
an action copied from the list of admissible actions is accepted whatever whitespace or case the
label has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

REQUIRED_INFO_KEYS: dict[str, type | tuple[type, ...]] = {
    "task": str,
    "task_id": str,
    "anchor_observation": str,
    "admissible_actions": list,
    "won": bool,
    "invalid_action": bool,
}


def normalize_action(text: str) -> str:
    """The one normalisation of actions and of the labels they are matched against.

    Lower-cases, strips, and collapses every run of whitespace (any Unicode whitespace: spaces,
    tabs, newlines, non-breaking spaces) to one space: ``"Click[Black  |\u00a0White]"`` ->
    ``"click[black | white]"``. Idempotent.

    Args:
        text: an action, or a label (button text, option value, admissible command).

    Returns:
        The normalised string (``""`` for whitespace only).
    """
    return " ".join(str(text).lower().split())


def split_size(sizes: dict[str, int], split: str, env_name: str) -> int:
    """``sizes[split]``, or ValueError naming the split flags and the env's splits."""
    if split not in sizes:
        raise ValueError(f"--env.train_split/--env.eval_split {split!r} is not a split of {env_name!r} ({sorted(sizes)})")
    return int(sizes[split])


@dataclass(frozen=True)
class StepResult:
    """What one ``env.step(action)`` returns.

    Attributes:
        observation: the text the agent sees next (env-level; templates add history later).
        reward: the environment's reward for this step (no invalid-action penalty applied).
        terminated: the episode ended inside the task (success or failure).
        truncated: the episode was cut by the step limit.
        info: see the module docstring for the required keys.
    """

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """True when the episode is over for either reason."""
        return self.terminated or self.truncated


@runtime_checkable
class TextEnv(Protocol):
    """A synchronous text environment (see module docstring)."""

    max_steps: int

    def reset(
        self, *, split: str, index: int | None = None, seed: int | None = None
    ) -> tuple[str, dict[str, Any]]: ...

    def num_tasks(self, split: str) -> int:
        """Tasks in ``split`` (``reset(index=i)`` takes ``0 <= i < num_tasks(split)``); ValueError for an
        unknown split."""
        ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...


class EnvFailure(RuntimeError):
    """An environment (process, actor or server) died or stopped answering mid-episode.

    The episode loop catches it and marks only that episode as failed (``Episode.failure_kind`` =
    the class's :attr:`kind`); the run goes on unless too many episodes of a batch failed.

    Attributes:
        kind: a short word naming the failure class, used as the failed episode's
            ``failure_kind`` and in the ``rollout/failed/<kind>`` metric.
    """

    kind: ClassVar[str] = "env_failure"


class EnvUnreachable(EnvFailure):
    """The env service could not be reached (connection refused or timed out)."""

    kind: ClassVar[str] = "env_unreachable"


class EnvSessionLost(EnvFailure):
    """The env service no longer knows the episode's session (a WebShop server restarted, or expired the
    session): server-side state is gone, so the episode cannot go on (it is not resumed in a fresh
    session, whose pages the model never saw)."""

    kind: ClassVar[str] = "env_session_lost"


class EnvDataMissing(EnvFailure):
    """The env could not find its data folder (a ``FileNotFoundError`` while building the env)."""

    kind: ClassVar[str] = "env_data_missing"


class EnvRejected(EnvFailure):
    """The env refused a request of the rollout itself (a ``ValueError`` from the env pool on the
    distributed path: e.g. an unknown split, or a WebShop 4xx at reset)."""

    kind: ClassVar[str] = "env_rejected"


class EnvNotStarted(EnvFailure):
    """The process that should host the env (a Ray env actor) did not start within its timeout."""

    kind: ClassVar[str] = "env_not_started"


@runtime_checkable
class EnvPool(Protocol):
    """Many environments driven concurrently by the async episode loop.

    Each episode is identified by an ``episode_id`` (any hashable, unique among running
    episodes). The pool maps it to one env instance (in-process, thread, or Ray actor).
    Methods raise ``EnvFailure`` when the env behind an episode died.
    """

    async def reset(
        self, episode_id: Any, *, split: str, index: int | None = None, seed: int | None = None
    ) -> tuple[str, dict[str, Any]]: ...

    async def step(self, episode_id: Any, action: str) -> StepResult: ...

    async def release(self, episode_id: Any) -> None: ...

    async def close(self) -> None: ...
