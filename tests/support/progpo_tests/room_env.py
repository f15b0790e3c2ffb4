"""A one-room env for the agent-text tests of both backends (``tests/openrlhf``)."""

from __future__ import annotations

from progpo.envs.base import StepResult


class RoomEnv:
    """One room; ``look`` is the only admissible action; three steps end the episode. ``task``: the task text
    (long ones make long prompts)."""

    def __init__(self, task: str = "look around", **_: object) -> None:
        self.t, self.task = 0, task

    def _info(self, invalid: bool = False) -> dict:
        return {"task": self.task, "task_id": "room", "anchor_observation": "You are in a room.",
                "admissible_actions": ["look"], "won": False, "invalid_action": invalid}

    def reset(self, *, split: str, index: int | None = None, seed: int | None = None):
        """Start the episode: ``(observation, info)``."""
        self.t = 0
        return "You are in a room.", self._info()

    def step(self, action: str) -> StepResult:
        """One step; the third ends the episode (truncated); any action but ``look`` is invalid."""
        self.t += 1
        return StepResult("You are in a room.", 0.0, False, self.t >= 3, self._info(action != "look"))

    def close(self) -> None:
        """Nothing to release."""
