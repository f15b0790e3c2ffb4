"""ALFWorld text games (Shridhar et al. 2021) behind the project's env protocol.

One ``AlfWorldEnv`` plays one game at a time through TextWorld's gym API
(``textworld.gym.envs.TextworldGymEnv`` over the game's PDDL file) with ALFWorld's own wrappers
(``AlfredDemangler``: object names such as "alarmclock 2"; ``AlfredInfos``: the game file) and
the logic shipped in the ``alfworld`` package. Games come from a ``json_2.1.1`` folder found or
unpacked by ``progpo.envs.alfworld_data``.

Conventions (see docs/alfworld.md):

* ``reset(split=, index=)`` plays game ``index`` of the sorted game list of ``split``; ``seed=``
  picks ``index = random.Random(seed).randrange(n_games)`` (deterministic). So the N members of a
  group that reset with the same (split, index) play the same game from the same first state.
* Reward ``success_reward`` (default 10.0, as in GiGPO/verl-agent) on the step that wins, else 0.
* ``terminated`` when won (ALFWorld games cannot be lost); ``truncated`` after ``max_steps`` steps.
* Envs in one process may be used from several threads (``LocalEnvPool``): their TextWorld calls
  are serialized by a process-wide lock, since TextWorld's parser is not thread-safe.
* Any text is a legal ``step`` argument: a command not among the admissible actions gets the
  game's own answer ("Nothing happens.") and ``info["invalid_action"] = True``.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import numbers
import os
import random
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from progpo.envs.alfworld_data import (
    SPLITS,
    TASK_TYPE_NAMES,
    game_id,
    list_games,
    resolve_data_dir,
    task_type_of,
)
from progpo.envs.base import StepResult, normalize_action
from progpo.envs.spec import ANSWER_FORMAT, PromptTemplate

logger = logging.getLogger(__name__)

_BANNER = re.compile(r"^-= Welcome to TextWorld, ALFRED! =-\s*")
_TASK = re.compile(r"Your task is to: (.*)")
_HIDDEN_ACTIONS = frozenset({"help"})
NOT_CARRYING = "You are not carrying anything."

ITEM_STATE_WORDS = {"isclean": "clean", "ishot": "hot", "iscool": "cool", "issliced": "sliced"}
"""ALFWorld's item-transition facts (the PDDL predicates ``isClean``, ``isHot``, ``isCool``, ``isSliced`` of
``alfworld/data/alfred.pddl``, as TextWorld names them) and the word ``state_extra`` says for each."""


def alfworld_state_extra(inventory: str, held: Sequence[tuple[str, Sequence[str]]]) -> str:
    """ALFWorld's ``state_extra``: the inventory sentence, then the item transitions of what the agent holds.

    Neither the observation nor the inventory sentence shows whether a held object has been cleaned, heated,
    cooled or sliced, yet that decides whether putting it down wins: without it, the states before and after
    the transition share one anchor state, and estimators that propagate values along the merged graph
    (CRBC, GRAFT) credit the transition wrongly. CRBC's ALFWorld key holds these transitions (arXiv 2609.35082,
    App. C.2).

    Args:
        inventory: the game's inventory sentence ("You are carrying: a apple 1.").
        held: ``(object name, words)`` per held object, the words from :data:`ITEM_STATE_WORDS`' values.
    Returns:
        ``inventory``, then ``"The apple 1 is cool."`` per held object with a transition (words joined by
        " and "), space-joined; ``inventory`` alone when no held object has one.
    """
    return " ".join([inventory] + [f"The {name} is {' and '.join(words)}." for name, words in held if words])

ALFWORLD_TEMPLATE = PromptTemplate(
    env_name="alfworld",
    with_history=(
        "You are an expert agent acting in the ALFRED embodied household environment. "
        "Your task is to: {task}\n"
        "Before this step you have taken {step_count} step(s). Here are the most recent "
        "{history_length} observations and the actions you took:\n{history}\n"
        "You are now at step {current_step} and your current observation is: {observation}\n"
        "Your admissible actions in the current situation are: [{actions}].\n\n" + ANSWER_FORMAT
    ),
    no_history=(
        "You are an expert agent acting in the ALFRED embodied household environment. "
        "Your task is to: {task}\n"
        "Your current observation is: {observation}\n"
        "Your admissible actions in the current situation are: [{actions}].\n\n" + ANSWER_FORMAT
    ),
    history_turn="[Observation {step}: '{observation}', Action {step}: '{action}']",
    history_separator="\n",
    action_item="'{action}'",
    action_separator="\n ",
    hidden_actions=tuple(sorted(_HIDDEN_ACTIONS)),  # never offered: the env drops them from its admissible list
)
"""ALFWorld's prompt (its spec's ``template``): verl-agent's ALFWorld prompt (Feng et al. 2025, arXiv:2505.10978,
Appendix prompts), rendered by ``progpo.agents.templates``."""

ALFWORLD_COMMANDS: tuple[str, ...] = (
    "look", "inventory", "help",
    "go to {}", "open {}", "close {}", "examine {}", "use {}",
    "take {} from {}", "move {} to {}", "put {} into {}", "put {} in {}",
    "heat {} with {}", "clean {} with {}", "cool {} with {}", "slice {} with {}",
)
"""ALFWorld's command templates (the ``template ::`` lines of every game's grammar in json_2.1.1),
each ``{}`` an object or receptacle."""

ALFWORLD_NAME = r"[a-z]+ [0-9]+"
"""An ALFWorld object name as commands spell it: its type, lower-cased, and its number
(``alfworld.agents.utils.misc.Demangler``: ``"alarmclock 2"``, ``"sinkbasin 1"``)."""

ALFWORLD_COMMAND = re.compile("|".join(
    "(?:" + re.escape(t).replace(re.escape("{}"), f"(?:{ALFWORLD_NAME})") + ")" for t in ALFWORLD_COMMANDS))
"""One ALFWorld command (``fullmatch`` on the normalised action)."""


def alfworld_syntax_ok(action: str) -> bool:
    """ALFWorld's spec ``syntax``: the action is one command of the games' grammar (:data:`ALFWORLD_COMMAND`)."""
    return ALFWORLD_COMMAND.fullmatch(action) is not None


# TextWorld's PDDL/grammar parsing (tatsu) keeps shared state: two games parsed or stepped at once in
# one process fail with IndexError/TypeError. Every TextWorld call of every AlfWorldEnv in this
# process therefore holds this lock (the work is CPU-bound under the GIL anyway; processes, e.g.
# RayEnvPool actors, run in parallel).
_TEXTWORLD_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _inventory_wrapper_class() -> type:
    """TextWorld wrapper that puts the inventory into the game state without an action.

    ALFWorld's PDDL games do not fill ``EnvInfos(inventory=True)``; this wrapper writes it from
    the ``holds(agent, object)`` facts, in the words of the game's own ``inventory`` answer
    ("You are carrying: a mug 1." / "You are not carrying anything."), and the extra ``state_extra``: that
    sentence and the held objects' item-transition facts (:data:`ITEM_STATE_WORDS`, :func:`alfworld_state_extra`).
    """
    import textworld

    class InventoryFromFacts(textworld.core.Wrapper):
        def _add_inventory(self, state: Any) -> Any:
            entities = state["_entity_infos"]
            facts = state["_facts"]
            held_ids = [fact.arguments[1].name for fact in facts if fact.name == "holds" and len(fact.arguments) == 2]
            held = [entities[i] for i in held_ids]
            if held:
                items = ", ".join(f"{e.indefinite} {e.name}" for e in held)
                state["inventory"] = f"You are carrying: {items}."
            else:
                state["inventory"] = NOT_CARRYING
            words = {i: [ITEM_STATE_WORDS[f.name] for f in facts if f.name in ITEM_STATE_WORDS
                         and len(f.arguments) == 1 and f.arguments[0].name == i] for i in held_ids}
            state["extra.state_extra"] = alfworld_state_extra(
                state["inventory"], [(entities[i].name, sorted(words[i])) for i in held_ids])
            return state

        def reset(self) -> Any:
            return self._add_inventory(super().reset())

        def step(self, command: str) -> Any:
            state, score, done = super().step(command)
            return self._add_inventory(state), score, done

    return InventoryFromFacts


TRANSLATION_CACHE_GAMES = 16
"""Games whose PDDL -> SAS translations one process keeps (:func:`_install_translation_cache`; per game two SAS texts
and their parsed tasks: docs/alfworld.md)."""


class _TranslationCache:
    """Memo of ``fast_downward.pddl2sas(domain, problem, optimize=...)`` keyed by a digest of its inputs, least recently
    used first out (``max_entries``).

    TextWorld's PDDL env translates the game's PDDL problem four times per reset (``PddlEnv.load`` and ``reset``
    each build a ``PddlState``, which translates twice: plain and optimised), about 80% of a reset's time, and a
    group of N rollouts resets the same game N times. The translation is a pure function of its text inputs and
    of ``optimize`` (it sets fast-downward's options itself on every call), so a hit returns the translation of
    the same inputs: a deep copy of the task object (the caller owns it, as after a real call) and the SAS text
    (immutable). ``verbose=True`` calls pass through, so that their output is printed.
    """

    def __init__(self, translate: Any, max_entries: int) -> None:
        self.translate, self.max_entries = translate, max_entries
        self.entries: OrderedDict[bytes, tuple[Any, str]] = OrderedDict()
        self.hits = self.misses = 0

    def __call__(self, domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> tuple[Any, str]:
        if verbose:
            return self.translate(domain, problem, verbose=verbose, optimize=optimize)
        digest = hashlib.blake2b(f"{bool(optimize)}\0{domain}\0{problem}".encode(), digest_size=20).digest()
        if digest in self.entries:
            self.hits += 1
            self.entries.move_to_end(digest)
        else:
            self.misses += 1
            self.entries[digest] = self.translate(domain, problem, verbose=verbose, optimize=optimize)
            while len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)
        task, sas = self.entries[digest]
        return copy.deepcopy(task), sas


def _install_translation_cache() -> _TranslationCache:
    """Put a :class:`_TranslationCache` (``2 * TRANSLATION_CACHE_GAMES`` entries: plain and optimised) in place of
    ``fast_downward.pddl2sas``, which TextWorld's PDDL logic looks up on the module at each call; once per process.
    Called under ``_TEXTWORLD_LOCK``, as every use of it is."""
    import fast_downward

    if not isinstance(fast_downward.pddl2sas, _TranslationCache):
        fast_downward.pddl2sas = _TranslationCache(fast_downward.pddl2sas, 2 * TRANSLATION_CACHE_GAMES)
    return fast_downward.pddl2sas


def _open_game(game_file: str) -> Any:
    """A TextWorld gym env over one ALFWorld game file, with ALFWorld's wrappers (its PDDL translations cached:
    :func:`_install_translation_cache`)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.gym.envs import TextworldGymEnv

    request_infos = textworld.EnvInfos(
        won=True, admissible_commands=True, inventory=True, extras=["gamefile", "state_extra"]
    )
    wrappers = [AlfredDemangler(shuffle=False), AlfredInfos, _inventory_wrapper_class()]
    _install_translation_cache()
    # max_episode_steps=None: truncation is ours, so that it stays apart from termination.
    return TextworldGymEnv([game_file], request_infos=request_infos, max_episode_steps=None,
                           wrappers=wrappers)


class AlfWorldEnv:
    """The ALFWorld text games as a ``progpo.envs.base.TextEnv``.

    Args:
        data_dir: a ``json_2.1.1`` folder or a folder holding one; None searches ``ALFWORLD_DATA``,
            the unpack cache, then unpacks the shared archive (``progpo.envs.alfworld_data``).
        max_steps: steps per episode before ``truncated`` (50 in GiGPO/verl-agent).
        success_reward: reward on the winning step (10.0 in GiGPO/verl-agent).

    Info keys after ``reset``/``step`` (beyond ``progpo.envs.base``): ``task_type`` (Pick, Look,
    Clean, Heat, Cool or Pick2), ``inventory`` (the game's inventory sentence), ``state_extra`` (the inventory sentence, then the held
    objects' item transitions, e.g. "You are carrying: a apple 1. The apple 1 is cool."; :func:`alfworld_state_extra`), ``game_file``
    (absolute path), ``steps`` (steps taken). ``task`` is the instruction after
    "Your task is to: ", ``task_id`` the game id ``<split>/<task folder>/<trial>``.

    Raises:
        ValueError: ``max_steps < 1`` or a non-finite ``success_reward``.
        FileNotFoundError: no game folder could be found (the message names where it looked).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        max_steps: int = 50,
        success_reward: float = 10.0,
    ) -> None:
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
        if not math.isfinite(float(success_reward)):
            raise ValueError(f"success_reward must be finite, got {success_reward!r}")
        self.max_steps = max_steps
        self.success_reward = float(success_reward)
        self.data_dir: Path = resolve_data_dir(data_dir)
        self._tw: Any = None
        self._game_file = ""
        self._info: dict[str, Any] = {}
        self._steps = 0
        self._done = True

    # ---- game list -------------------------------------------------------------------------
    def games(self, split: str) -> tuple[str, ...]:
        """Sorted game files of ``split`` (index ``i`` of ``reset`` is ``games(split)[i]``)."""
        return list_games(self.data_dir, split)

    def num_tasks(self, split: str) -> int:
        """Number of games in ``split``."""
        return len(self.games(split))

    def game_index(self, split: str, *, index: int | None = None, seed: int | None = None) -> int:
        """The game index ``reset`` would play (``index`` wins over ``seed``).

        Raises:
            ValueError: unknown split, neither index nor seed, or index out of range.
        """
        n = self.num_tasks(split)
        if index is None:
            if seed is None:
                raise ValueError("reset needs index= or seed= (got neither)")
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
                raise ValueError(f"seed must be an int, got {seed!r}")
            return random.Random(int(seed)).randrange(n)
        if isinstance(index, bool) or not isinstance(index, numbers.Integral) or not 0 <= index < n:
            raise ValueError(f"index must be an int in [0, {n}) for split {split!r}, got {index!r}")
        return int(index)

    # ---- protocol --------------------------------------------------------------------------
    def reset(
        self, *, split: str, index: int | None = None, seed: int | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start game ``index`` (or the one ``seed`` picks) of ``split``; see the class docstring.

        Returns:
            (observation, info): the room description and task, without TextWorld's banner.

        Raises:
            ValueError: unknown split (not one of ``SPLITS``), neither index nor seed given, or
                index out of range.
        """
        if split not in SPLITS:
            raise ValueError(f"unknown ALFWorld split {split!r}; choose one of {list(SPLITS)}")
        game_file = self.games(split)[self.game_index(split, index=index, seed=seed)]
        with _TEXTWORLD_LOCK:
            if self._tw is not None:
                self._tw.close()
            self._tw = _open_game(game_file)
            raw_obs, raw_info = self._tw.reset()
        obs = _BANNER.sub("", raw_obs)
        match = _TASK.search(obs)
        self._game_file = game_file
        self._steps = 0
        self._done = False
        self._info = {
            "task": match.group(1).strip() if match else "",
            "task_id": game_id(game_file),
            "task_type": task_type_of(game_file),
            "game_file": game_file,
        }
        return obs, self._make_info(obs, raw_info, invalid=False)

    def step(self, action: str) -> StepResult:
        """Send ``action`` to the game (lower-cased, whitespace collapsed).

        Raises:
            RuntimeError: called before ``reset`` or after the episode ended.
        """
        if self._tw is None or self._done:
            raise RuntimeError("AlfWorldEnv.step called with no running episode; call reset first")
        command = normalize_action(action)
        invalid = command not in {normalize_action(a) for a in self._info["admissible_actions"]}
        with _TEXTWORLD_LOCK:
            obs, _score, _game_done, raw_info = self._tw.step(command)
        self._steps += 1
        won = bool(raw_info["won"])
        terminated = won
        truncated = not terminated and self._steps >= self.max_steps
        self._done = terminated or truncated
        info = self._make_info(obs, raw_info, invalid=invalid)
        reward = self.success_reward if won else 0.0
        return StepResult(obs, reward, terminated, truncated, info)

    def close(self) -> None:
        """Close the running game (the env can be reset again afterwards)."""
        if self._tw is not None:
            with _TEXTWORLD_LOCK:
                self._tw.close()
            self._tw = None
        self._done = True

    # ---- helpers ---------------------------------------------------------------------------
    def _make_info(self, obs: str, raw_info: dict[str, Any], *, invalid: bool) -> dict[str, Any]:
        admissible = [a for a in raw_info["admissible_commands"] if a not in _HIDDEN_ACTIONS]
        self._info.update(
            anchor_observation=obs,
            admissible_actions=admissible,
            won=bool(raw_info["won"]),
            invalid_action=invalid,
            inventory=raw_info.get("inventory") or NOT_CARRYING,
            steps=self._steps,
        )
        # the protocol's optional key (envs.base): the inventory and the held items' transitions
        self._info["state_extra"] = raw_info.get("extra.state_extra") or self._info["inventory"]
        return dict(self._info, admissible_actions=list(admissible))


# ---- evaluation ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SuccessRate:
    """Success rate of one task type (or overall) with a Wilson score interval.

    Attributes:
        n: episodes counted.
        wins: episodes won.
        rate: wins / n (nan when n == 0).
        low, high: the Wilson score interval (Wilson 1927, "Probable inference, the law of
            succession, and statistical inference", JASA 22:209) at the requested confidence.
    """

    n: int
    wins: int
    rate: float
    low: float
    high: float


def wilson_interval(wins: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (nan, nan when n == 0).

    ``(p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)`` with ``p = wins/n`` and
    ``z`` the normal quantile at ``(1 + confidence) / 2`` (Wilson 1927).

    Raises:
        ValueError: ``wins`` outside [0, n] or ``confidence`` outside (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n < 0 or not 0 <= wins <= n:
        raise ValueError(f"need 0 <= wins <= n, got wins={wins}, n={n}")
    if n == 0:
        return math.nan, math.nan
    from statistics import NormalDist

    z = NormalDist().inv_cdf((1 + confidence) / 2)
    p = wins / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def success_by_task_type(
    task_types: Sequence[str], won: Sequence[bool], confidence: float = 0.95
) -> dict[str, SuccessRate]:
    """Per-task-type and overall success rates of ALFWorld episodes (the papers' table columns).

    Args:
        task_types: ``[E]`` each episode's ``info["task_type"]`` (Pick, Look, Clean, Heat, Cool,
            Pick2).
        won: ``[E]`` whether each episode was won.
        confidence: level of the Wilson intervals.

    Returns:
        ``{"Pick": ..., ..., "Pick2": ..., "overall": ...}``: all six types always present
        (``n = 0`` and nan rates for types not played).

    Raises:
        ValueError: different lengths, or an unknown task type.
    """
    if len(task_types) != len(won):
        raise ValueError(f"task_types ({len(task_types)}) and won ({len(won)}) differ in length")
    counts = {name: [0, 0] for name in TASK_TYPE_NAMES}
    for task_type, w in zip(task_types, won):
        if task_type not in counts:
            raise ValueError(f"unknown task type {task_type!r}; expected one of {TASK_TYPE_NAMES}")
        counts[task_type][0] += 1
        counts[task_type][1] += int(bool(w))
    counts["overall"] = [len(won), sum(int(bool(w)) for w in won)]
    out = {}
    for name, (n, wins) in counts.items():
        low, high = wilson_interval(wins, n, confidence)
        out[name] = SuccessRate(n, wins, wins / n if n else math.nan, low, high)
    return out


def alfworld_summary(episodes: Sequence[Any]) -> dict[str, Any]:
    """ALFWorld's spec ``summary`` of finished evaluation episodes (``progpo.agents.types.Episode``: their
    ``info["task_type"]`` and ``won``): success per task type with Wilson 95% intervals."""
    by_type = success_by_task_type([str(ep.info.get("task_type")) for ep in episodes], [ep.won for ep in episodes])
    return {"success_by_task_type": {k: {"rate": v.rate, "low": v.low, "high": v.high, "n": v.n, "wins": v.wins}
                                     for k, v in by_type.items() if k != "overall"}}
