"""Fixtures for the episode-loop tests: a tiny in-process fake env (the Qwen3 tokenizer is in tests/conftest.py).

Helpers are handed out as fixtures (not imported from a module): an installed OpenRLHF ships its
own top-level ``tests`` package, so ``import tests.agents...`` would be ambiguous.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from progpo.envs.base import StepResult
from progpo_tests.patience import PATIENCE_S

class FakeEnv:
    """A deterministic corridor game behind the env protocol (``progpo.envs.base``).

    Task ``index`` asks to reach room ``goal = 2 + index % 3``; the forward action moves one room,
    ``look`` does nothing, anything else is flagged invalid. Reaching the goal gives reward 10 and
    ends the episode (``won``). ``style`` picks WebShop-like (``click[forward]``) or ALFWorld-like
    (``go to door 1``) action strings. ``fail_at_step`` makes ``step`` raise (a dying env).
    """

    def __init__(self, style: str = "alfworld", max_steps: int = 8, fail_at_step: int | None = None,
                 fail_splits: tuple[str, ...] = ("train",), fail_indices: tuple[int, ...] = (),
                 fail_reset_indices: tuple[int, ...] = ()) -> None:
        self.style = style
        self.max_steps = max_steps
        self.fail_at_step = fail_at_step
        self.fail_indices = fail_indices
        self.fail_splits = fail_splits
        self.fail_reset_indices = fail_reset_indices
        self.forward = "click[forward]" if style == "webshop" else "go to door 1"
        self.look = "search[room]" if style == "webshop" else "look"
        self.closed = False

    def _info(self, invalid: bool = False) -> dict[str, Any]:
        obs = f"You are in room {self.pos}."
        info = {
            "task": f"reach room {self.goal}",
            "task_id": f"{self.split}-{self.index}",
            "anchor_observation": obs,
            "admissible_actions": [self.forward, self.look, "help"],
            "won": self.pos == self.goal,
            "invalid_action": invalid,
        }
        if self.style == "alfworld":
            info["inventory"] = info["state_extra"] = f"You carry {self.pos} keys."
            info["task_type"] = "corridor"
        return info

    def reset(self, *, split: str, index: int | None = None, seed: int | None = None):
        self.split, self.index = split, int(index or 0)
        if self.index in self.fail_reset_indices:
            raise ConnectionError("fake env server unreachable")
        self.goal, self.pos, self.t = 2 + self.index % 3, 0, 0
        return f"You are in room 0. Your task is to: reach room {self.goal}", self._info()

    def step(self, action: str) -> StepResult:
        self.t += 1
        if self.fail_at_step is not None and self.t >= self.fail_at_step and self.index in self.fail_indices:
            raise RuntimeError("fake env process died")
        invalid = action not in (self.forward, self.look, "help")
        if action == self.forward:
            self.pos += 1
        won = self.pos == self.goal
        truncated = not won and self.t >= self.max_steps
        obs = "Nothing happens." if invalid else f"You are in room {self.pos}."
        return StepResult(obs, 10.0 if won else 0.0, won, truncated, self._info(invalid))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_env_cls():
    """The :class:`FakeEnv` class (build with ``functools.partial`` for a ``LocalEnvPool``)."""
    return FakeEnv


def admissible_from_prompt(prompt: str) -> list[str]:
    """Quoted admissible actions of the last action list in a rendered prompt."""
    block = prompt.rsplit("admissible actions in the current situation are:", 1)[-1]
    block = block.split("].", 1)[0]
    return re.findall(r"'([^']*)'", block)


@pytest.fixture
def admissible_parser():
    """:func:`admissible_from_prompt`, for scripted policies that read the action list."""
    return admissible_from_prompt


@pytest.fixture(scope="session")
def webshop_url(shared_data):
    """One real WebShop server (waitress subprocess, loopback, free port) for the agents tests."""
    process = pytest.importorskip("envs.webshop_server.process")
    path = shared_data / "webshop"
    if not path.is_dir():
        pytest.fail(f"WebShop data not found at {path}")
    proc = process.WebShopServerProcess(data_dir=path, port=0, threads=8, start_timeout_s=PATIENCE_S)
    proc.start()
    try:
        yield proc.url
    finally:
        proc.stop()
