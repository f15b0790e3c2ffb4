"""Expert trajectories for behaviour cloning, played through the RL episode loop itself.

An expert here is a small stateful policy ``act(info) -> (think, action)`` over the env's current
``info`` (task, page, admissible actions). :func:`expert_episodes` plays it with
``progpo.agents.episode.run_episodes``, the same loop (templates, history window, context guard,
parser) the RL rollout uses: the expert's answer ``<think>{think}</think><action>{action}</action>``
is served by a ``ScriptedGenerate``, and a thin pool wrapper shows the expert the info of its own
episode. So every expert step is a ``StepRecord`` whose ``prompt_ids`` are exactly what the policy
would see at that state during RL, and ``response_ids`` (answer tokens + EOS) are its target.

Experts:

* :class:`WebShopExpert`: knows its goal (product ASIN and options, looked up from the server's
  own goal list, over HTTP, by the episode's goal index). Searches with the goal's words (the instruction
  without its option and price clauses), opens the goal product (paging through up to
  ``max_pages`` result pages), clicks each goal option, then ``buy now``. Without the product on
  those pages it gives up with the first result (an unsuccessful demonstration, filtered out later).
* :class:`AlfWorldExpert`: replays the game's walkthrough (``walkthrough`` in ``game.tw-pddl``).

The think text is short and templated per action kind; the action is the expert's.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from progpo.agents.episode import EpisodeConfig, EpisodeEnv, EpisodeRollout, TaskSpec, run_episodes
from progpo.agents.scripted import ScriptedGenerate
from progpo.agents.types import Episode, SamplingParams
from progpo.envs.base import StepResult

_PRICE = re.compile(r",? and price lower than [\d.]+ dollars\s*$", re.IGNORECASE)


def render_answer(think: str, action: str) -> str:
    """The protocol answer ``<think>...</think><action>...</action>`` (see ``progpo.agents.parsing``)."""
    return f"<think>{think}</think><action>{action}</action>"


class Expert(Protocol):
    """``act(info) -> (think, action)`` for the current step of one episode."""

    def act(self, info: dict[str, Any]) -> tuple[str, str]: ...


# ---- WebShop ---------------------------------------------------------------------------------
class WebShopGoals:
    """The goal list of a running WebShop server, read over HTTP (``GET /api/goals/<index>``).

    ``info["task_id"]`` of ``WebShopEnv`` is the index into this list. Goals are fetched when first
    asked for and kept. The training package talks to the server only over HTTP.

    Args:
        base_url: the server's base URL (``http://127.0.0.1:PORT``).
        timeout_s: per-request timeout in seconds.

    Raises (from ``[index]``):
        IndexError: the server has no goal ``index``.
        requests.RequestException: the server did not answer.
    """

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._cache: dict[int, dict[str, Any]] = {}

    def __getitem__(self, index: int) -> dict[str, Any]:
        import requests

        index = int(index)
        if index not in self._cache:
            r = requests.get(f"{self.base_url}/api/goals/{index}", timeout=self.timeout_s)
            if r.status_code == 404:
                raise IndexError(f"WebShop server {self.base_url} has no goal {index}")
            r.raise_for_status()
            self._cache[index] = r.json()
        return self._cache[index]


def webshop_goals(base_url: str) -> WebShopGoals:
    """The goals of the WebShop server at ``base_url`` (see :class:`WebShopGoals`)."""
    return WebShopGoals(base_url)


def goal_query(goal: dict[str, Any]) -> str:
    """Search words of a goal: its instruction without the price clause and the option clause."""
    text = _PRICE.sub("", goal["instruction_text"]).strip()
    options = goal.get("goal_options") or {}
    if isinstance(options, dict) and options:
        clause = " with " + ", and ".join(f"{k}: {v}" for k, v in options.items())
        if text.endswith(clause):
            text = text[: -len(clause)]
    return " ".join(text.lower().split())


def _option_values(goal: dict[str, Any]) -> list[str]:
    options = goal.get("goal_options") or {}
    values = options.values() if isinstance(options, dict) else options
    return [" ".join(str(v).lower().split()) for v in values]


class WebShopExpert:
    """Scripted WebShop expert for one episode (see module docstring).

    Args:
        goals: the server's goal list (:func:`webshop_goals`); ``info["task_id"]`` indexes it.
        max_pages: result pages searched for the goal product before giving up.

    Raises (from ``act``):
        ValueError: the episode's instruction differs from the goal's (wrong data folder).
    """

    def __init__(self, goals: Sequence[dict[str, Any]], max_pages: int = 3) -> None:
        self.goals = goals
        self.max_pages = max_pages
        self.goal: dict[str, Any] | None = None
        self.page = 0
        self.clicked: set[str] = set()

    def _bind(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.goal is None:
            goal = self.goals[int(info["task_id"])]
            if " ".join(goal["instruction_text"].split()) != " ".join(str(info.get("task", "")).split()):
                raise ValueError(f"WebShop goal {info['task_id']} of this data folder is {goal['instruction_text']!r}, "
                                 f"but the server's task is {info.get('task')!r}: the expert and the server use "
                                 "different data")
            self.goal = goal
        return self.goal

    def act(self, info: dict[str, Any]) -> tuple[str, str]:
        """The next ``(think, action)``; the action is one of ``info["admissible_actions"]``."""
        goal = self._bind(info)
        actions = list(info.get("admissible_actions", []))
        target = f"click[{goal['asin'].lower()}]"
        if "search[<your query>]" in actions:
            self.page = 1
            return "I will search for the item the task describes.", f"search[{goal_query(goal)}]"
        if target in actions:
            return "This item matches the task, so I open it.", target
        if "click[buy now]" in actions:  # on the goal product's page
            for value in _option_values(goal):
                if value not in self.clicked and f"click[{value}]" in actions:
                    self.clicked.add(value)
                    return f"The task asks for {value}, so I select it.", f"click[{value}]"
            return "All requested options are selected, so I buy it.", "click[buy now]"
        if "click[next >]" in actions and self.page < self.max_pages:
            self.page += 1
            return "The matching item is not on this page, so I look at the next page.", "click[next >]"
        items = [a for a in actions if re.fullmatch(r"click\[b[0-9a-z]{9}\]", a)]
        if items:  # give up: an unsuccessful demonstration (filtered out before training)
            return "I could not find the exact item, so I open the first result.", items[0]
        return "I go back to search.", actions[0] if actions else "click[back to search]"


def webshop_expert(env_kwargs: dict[str, Any]) -> Callable[[], WebShopExpert]:
    """The WebShop spec's ``expert``: a factory of :class:`WebShopExpert` over the goals of the server
    at ``env_kwargs["base_url"]`` (shared by every episode, fetched once each)."""
    goals = webshop_goals(env_kwargs["base_url"])
    return lambda: WebShopExpert(goals)


# ---- ALFWorld --------------------------------------------------------------------------------
def alfworld_walkthrough(game_file: str | Path) -> list[str]:
    """The expert action list stored in an ALFWorld ``game.tw-pddl`` file.

    Raises:
        ValueError: the file has no walkthrough.
    """
    data = json.loads(Path(game_file).read_text())
    walk = data.get("walkthrough")
    if not walk:
        raise ValueError(f"{game_file} has no walkthrough")
    return [" ".join(str(a).lower().split()) for a in walk]


def _alfworld_think(action: str) -> str:
    """A short templated reason for a walkthrough command, by its verb."""
    templates = {
        "go": "Next I {action}.",
        "take": "I need to {action}.",
        "put": "Now I {action}.",
        "open": "I {action} to look inside.",
        "close": "I {action}.",
        "heat": "The task needs it hot, so I {action}.",
        "cool": "The task needs it cool, so I {action}.",
        "clean": "The task needs it clean, so I {action}.",
        "use": "I {action} to look at the object.",
        "slice": "I {action}.",
    }
    return templates.get(action.split(" ", 1)[0], "Next I {action}.").format(action=action)


class AlfWorldExpert:
    """Replays the walkthrough of the episode's game (``info["game_file"]``), one action per step."""

    def __init__(self) -> None:
        self.walk: list[str] | None = None

    def act(self, info: dict[str, Any]) -> tuple[str, str]:
        """Walkthrough action number ``info["steps"]`` (``look`` once it is exhausted)."""
        if self.walk is None:
            self.walk = alfworld_walkthrough(info["game_file"])
        t = int(info.get("steps", 0))
        action = self.walk[t] if t < len(self.walk) else "look"
        return _alfworld_think(action), action


def alfworld_expert(env_kwargs: dict[str, Any]) -> Callable[[], AlfWorldExpert]:
    """The ALFWorld spec's ``expert``: a factory of :class:`AlfWorldExpert` (walkthroughs need no setup)."""
    return AlfWorldExpert


# ---- playing experts through the episode loop ---------------------------------------------------
class _ObservedPool:
    """An ``EnvPool`` view that remembers the last ``info`` its (single) episode returned."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.info: dict[str, Any] = {}

    async def reset(self, episode_id: Any, *, split: str, index: int | None = None,
                    seed: int | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = await self.pool.reset(episode_id, split=split, index=index, seed=seed)
        self.info = info
        return obs, info

    async def step(self, episode_id: Any, action: str) -> StepResult:
        res = await self.pool.step(episode_id, action)
        self.info = res.info
        return res

    async def release(self, episode_id: Any) -> None:
        await self.pool.release(episode_id)


async def expert_episodes(
    tasks: Sequence[TaskSpec], *, env_pool: Any, tokenizer: Any, env: EpisodeEnv, rollout: EpisodeRollout,
    make_expert: Callable[[], Expert], concurrency: int = 8, on_episode_end: Callable[[Episode], None] | None = None,
) -> list[Episode]:
    """Play one expert episode per task through ``run_episodes`` (see module docstring).

    Args:
        tasks: ``[U]`` tasks. env_pool: the run's env pool. tokenizer: the policy's tokenizer
            (prompts and answers are tokenized with it).
        env, rollout: the run's ``--env.*`` (resolved) and ``--rollout.*`` settings, as in the RL rollout:
            step limit, history window, context guard, invalid-format penalty; answers longer than
            ``rollout.max_new_tokens`` are cut (and then no longer parse).
        make_expert: a new expert per episode.
        concurrency: episodes in flight at once.

    Returns:
        ``[U]`` episodes in task order (``won`` tells which demonstrations succeeded).
    """
    limit = asyncio.Semaphore(max(1, concurrency))
    cfg = EpisodeConfig(env=env, rollout=rollout, sampling=SamplingParams(temperature=1.0,
                                                                          max_new_tokens=rollout.max_new_tokens))

    async def one(k: int, task: TaskSpec) -> Episode:
        async with limit:
            pool = _ObservedPool(env_pool)
            expert = make_expert()
            generate = ScriptedGenerate(tokenizer, lambda _prompt: render_answer(*expert.act(pool.info)))
            (ep,) = await run_episodes([task], cfg, env_pool=pool, generate=generate, tokenizer=tokenizer,
                                       traj_id_start=k, on_episode_end=on_episode_end)
            return ep

    return list(await asyncio.gather(*(one(k, t) for k, t in enumerate(tasks))))
