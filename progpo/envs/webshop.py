"""``WebShopEnv``: the project's text-env protocol over the WebShop server's JSON API.

Start a server with ``envs.webshop_server.process.WebShopServerProcess`` (or
``python -m envs.webshop_server``) and point ``base_url`` at it. One env holds one server session
at a time; many envs (threads, processes, Ray actors) can share one server.

Observation: the original WebShop ``text`` (or ``text_rich``) page observation, which begins with the
instruction. ``info["anchor_observation"]`` is the page text after the instruction (GiGPO's anchor
state: the same page reached in different episodes of a group compares equal).
``info["admissible_actions"]``: ``"search[<your query>]"`` when the page has a search bar, then
``click[x]`` for every clickable (as verl-agent's WebShop wrapper lists them), ``x`` in the
``normalize_action`` form the agent's parser gives actions (see :func:`admissible_actions`).

``info["state_extra"]``: the options already chosen on the current item (``"Selected options: color: black,
size: large."``, ``"Selected options: none."`` off item pages), the state that matters for the reward and
that the default ``text`` page does not show: an item page reads the same before and after a click on an
option (the original simulator keeps the choice in the page URL). The estimators key anchor states on
(observation, state_extra) with ``state_key = obs_inventory``, as ALFWorld's inventory.

Reward: 0 on every step except the purchase, where it is ``score * success_reward``; ``score`` in
[0, 1] is the original WebShop reward (``info["score"]``, breakdown in ``info["reward_breakdown"]``).
``success_reward`` defaults to 10, the scale GiGPO (Feng et al. 2025) trains WebShop with.
``won`` = (score == 1.0).
"""

from __future__ import annotations

import ast
import json
import math
import random
import re
from typing import Any
from urllib.parse import unquote

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from progpo.envs.base import EnvFailure, EnvSessionLost, EnvUnreachable, StepResult, normalize_action, split_size
from progpo.envs.spec import ANSWER_FORMAT, PromptTemplate

SEARCH_MARKER = "search[<your query>]"
SPLITS = ("train", "eval", "test")
CONNECT_RETRIES = 6
"""Default retries of a request whose connection was refused (nothing reached the server), with
exponential backoff (0.5 s doubling: ~15 s in all with httpx, ~30 s with urllib3): a WebShop server
that restarts within that window serves the request."""

WEBSHOP_TEMPLATE = PromptTemplate(
    env_name="webshop",
    with_history=(
        "You are an expert autonomous agent shopping in the WebShop e-commerce environment.\n"
        "Your task is to: {task}.\n"
        "Before this step you have taken {step_count} step(s). Here are the most recent "
        "{history_length} observations and the actions you took:\n{history}\n"
        "You are now at step {current_step} and your current observation is: {observation}\n"
        "Your admissible actions in the current situation are:\n[\n{actions}\n].\n\n"
        + ANSWER_FORMAT.replace(
            "situation;", "situation and which admissible action best advances the shopping goal;"
        )
    ),
    no_history=(
        "You are an expert autonomous agent shopping in the WebShop e-commerce environment.\n"
        "Your task is to: {task}.\n"
        "Your current observation is: {observation}\n"
        "Your admissible actions in the current situation are:\n[\n{actions}\n].\n\n"
        + ANSWER_FORMAT.replace(
            "situation;", "situation and which admissible action best advances the shopping goal;"
        )
    ),
    history_turn="[Observation {step}: '{observation}', Action {step}: '{action}']",
    history_separator="\n",
    action_item="'{action}'",
    action_separator=",\n",
)
"""WebShop's prompt (its spec's ``template``): verl-agent's WebShop prompt (Feng et al. 2025, arXiv:2505.10978,
Appendix prompts), rendered by ``progpo.agents.templates``."""

WEBSHOP_ACTION = re.compile(r"(search|click)\[((?:[^\[]+\[?)|\[)\]", re.DOTALL)
"""One WebShop action (``fullmatch`` on the normalised action); see ``progpo.agents.parsing``'s module docstring."""


def webshop_syntax_ok(action: str) -> bool:
    """WebShop's spec ``syntax``: the action is one command of the server's grammar (:data:`WEBSHOP_ACTION`)."""
    return WEBSHOP_ACTION.fullmatch(action) is not None


class WebShopEnv:
    """WebShop over HTTP.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:3000``.
        max_steps: the episode is truncated after this many steps (default 15, as GiGPO/verl-agent).
        observation_mode: ``"text"`` (``[SEP]``-joined, default) or ``"text_rich"``.
        success_reward: env reward = score * success_reward on purchase (default 10).
        timeout_s: HTTP timeout per request, seconds.
        connect_retries: retries of a request whose connection failed (nothing was sent: safe for
            every request), with exponential backoff (:data:`CONNECT_RETRIES`); a read timeout or an
            answer is never retried. When they run out: ``EnvUnreachable``.

    Server restarts: sessions are the server's state. A step of a session the server does not know
    (it restarted, or expired the session) raises ``EnvSessionLost``: the episode fails and is counted;
    new episodes run on the restarted server.

    Raises:
        ValueError: bad argument (names the argument).
    """

    def __init__(
        self,
        base_url: str,
        max_steps: int = 15,
        observation_mode: str = "text",
        success_reward: float = 10.0,
        timeout_s: float = 30.0,
        connect_retries: int = CONNECT_RETRIES,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
        if observation_mode not in ("text", "text_rich"):
            raise ValueError(f"observation_mode must be 'text' or 'text_rich', got {observation_mode!r}")
        if not _finite_positive(success_reward):
            raise ValueError(f"success_reward must be a finite number > 0, got {success_reward!r}")
        if not _finite_positive(timeout_s):  # None would let a silent server hang the episode forever
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
        check_connect_retries(connect_retries)
        self.base_url = base_url.rstrip("/")
        self.max_steps = max_steps
        self.observation_mode = observation_mode
        self.success_reward = float(success_reward)
        self.timeout_s = timeout_s
        self.connect_retries = connect_retries
        self._http = requests.Session()
        retry = Retry(total=None, connect=connect_retries, read=0, status=0, other=0, redirect=0, backoff_factor=0.5)
        for prefix in ("http://", "https://"):
            self._http.mount(prefix, HTTPAdapter(max_retries=retry))
        self._sid: str | None = None
        self._session_base: str | None = None
        self._split_sizes: dict[str, int] | None = None
        self._task = ""
        self._task_id = ""
        self._steps = 0
        self._done = False
        self._end = (False, False)
        self._last_obs = ""
        self._last_info: dict[str, Any] = {}

    # ----- HTTP ----------------------------------------------------------------------------------
    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One request; EnvUnreachable when the server cannot be reached, EnvFailure when it is
        broken, ValueError on a 4xx answer."""
        try:
            r = self._http.request(method, self._url(path), timeout=self.timeout_s, **kwargs)
        except requests.RequestException as e:
            raise EnvUnreachable(f"WebShop server at {self.base_url} unreachable: {e}") from e
        return self._answer(path, r.status_code, r.text)

    def _url(self, path: str) -> str:
        """Where ``path`` goes: a session's own requests to the worker process holding it (the
        ``session_url`` of its views, when the server runs several workers), others to ``base_url``."""
        if self._session_base is not None and path.startswith("/api/sessions/"):
            return self._session_base + path
        return self.base_url + path

    def _answer(self, path: str, status: int, text: str) -> dict[str, Any]:
        """Decode one answer: EnvFailure on 5xx, unknown session, non-JSON or a view missing fields;
        ValueError on other 4xx (the server refused the request itself)."""
        if status == 404 and path.startswith("/api/sessions/"):
            raise EnvSessionLost(f"WebShop server at {self.base_url} does not know the episode's session (it restarted "
                                 f"or expired it; the episode cannot resume): {_error_text(text)}")
        if status >= 500:
            raise EnvFailure(f"WebShop server error {status} on {path}: {text[:300]}")
        if status == 409:  # the server cannot serve this at all (e.g. an empty split): not the agent's doing
            raise EnvFailure(f"WebShop server at {self.base_url} cannot serve {path}: {_error_text(text)}")
        if status >= 400:
            raise ValueError(f"WebShop server rejected {path}: {status} {text[:300]}")
        try:
            data = json.loads(text)
        except ValueError:  # not ours to call an invalid action: the server is the wrong one or broken
            raise EnvFailure(f"WebShop server at {self.base_url} answered non-JSON on {path}: {text[:200]!r}") from None
        if not isinstance(data, dict):
            raise EnvFailure(f"WebShop server at {self.base_url} answered {type(data).__name__}, not an object, on {path}")
        if path.startswith("/api/sessions"):
            missing = [k for k in _VIEW_FIELDS + (("valid",) if path.endswith("/step") else ()) if k not in data]
            if missing:
                raise EnvFailure(f"WebShop server at {self.base_url} answered {path} without fields {missing}")
        return data

    def split_sizes(self) -> dict[str, int]:
        """Number of goals per split, from the server's ``/health``."""
        if self._split_sizes is None:
            self._split_sizes = dict(self._call("GET", "/health")["splits"])
        return self._split_sizes

    def num_tasks(self, split: str) -> int:
        """Goals in ``split`` (``TextEnv`` protocol). Raises ValueError for a split the server does not serve."""
        return split_size(self.split_sizes(), split, "webshop")

    # ----- protocol --------------------------------------------------------------------------------
    def reset(self, *, split: str, index: int | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start task ``index`` of ``split`` (or one drawn from ``seed``).

        Raises:
            ValueError: unknown split, index out of range, or neither index nor seed given.
            EnvFailure: the server is unreachable or broken, or ``split`` holds no goal.
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        if index is None:
            if seed is None:
                raise ValueError("reset needs index or seed")
            index = self._index_from_seed(split, seed, self.split_sizes())
        self.close()
        view = self._call("POST", "/api/sessions",
                          json={"split": split, "index": index, "observation_mode": self.observation_mode})
        self._sid = view["session_id"]
        self._session_base = _session_base(view)
        self._task = view["instruction"]
        self._task_id = str(view["goal_index"])
        self._steps = 0
        self._done = False
        self._last_obs = view["observation"]
        self._last_info = self._info(view, invalid=False)
        return self._last_obs, dict(self._last_info)

    def _index_from_seed(self, split: str, seed: int, sizes: dict[str, int]) -> int:
        """Task index drawn from ``seed``; EnvFailure naming the split when it holds no goal."""
        if not sizes.get(split):
            raise EnvFailure(f"WebShop split {split!r} has no goals at {self.base_url} (goals per split: "
                             f"{', '.join(f'{k} {v}' for k, v in sizes.items())}); use a larger catalog")
        return random.Random(seed).randrange(sizes[split])

    def step(self, action: str) -> StepResult:
        """Send one action (``search[...]`` / ``click[...]``); never raises for a bad action."""
        if self._sid is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            return self._repeat_end()
        self._steps += 1
        try:
            view = self._call("POST", f"/api/sessions/{self._sid}/step",
                              json={"action": str(action), "observation_mode": self.observation_mode})
        except ValueError as e:  # the server refused the action itself (e.g. too long): a no-op
            return self._refused(e)
        return self._stepped(view)

    # step bookkeeping shared with the async client (progpo.envs.http_pool)
    def _repeat_end(self) -> StepResult:
        """The episode is over: repeat its end state, no reward."""
        info = dict(self._last_info, invalid_action=True)
        return StepResult(self._last_obs, 0.0, self._end[0], self._end[1], info)

    def _refused(self, error: ValueError) -> StepResult:
        """The server refused the action (4xx): an invalid no-op step (it still counts)."""
        truncated = self._steps >= self.max_steps
        self._done = truncated
        self._end = (False, truncated)
        info = dict(self._last_info, invalid_action=True, message=str(error))
        return StepResult(self._last_obs, 0.0, False, truncated, info)

    def _stepped(self, view: dict[str, Any]) -> StepResult:
        """The StepResult of a step view (reward only on the purchase, truncation at max_steps)."""
        terminated = bool(view["done"])
        score = float(view["reward"]) if terminated else 0.0
        reward = score * self.success_reward if terminated else 0.0
        truncated = not terminated and self._steps >= self.max_steps
        self._done = terminated or truncated
        self._end = (terminated, truncated)
        self._last_obs = view["observation"]
        self._last_info = self._info(view, invalid=not view["valid"])
        return StepResult(self._last_obs, float(reward), terminated, truncated, dict(self._last_info))

    def _info(self, view: dict[str, Any], invalid: bool) -> dict[str, Any]:
        admissible = admissible_actions(view["available_actions"])
        done = bool(view["done"])
        score = float(view["reward"]) if done else 0.0
        return {
            "task": self._task,
            "task_id": self._task_id,
            "anchor_observation": anchor_text(view["observation"], self._task),
            "admissible_actions": admissible if not done else [],
            "won": done and score == 1.0,
            "invalid_action": invalid,
            "score": score,
            "reward_breakdown": view.get("reward_info") or {},
            "url": view["url"],
            "state_extra": options_text(selected_options(view["url"])),
            "page": view["page"],
            "message": view.get("message", ""),
        }

    def close(self) -> None:
        """Drop the server session (ignores a dead server)."""
        if self._sid is not None:
            try:
                self._http.delete(self._url(f"/api/sessions/{self._sid}"), timeout=self.timeout_s)
            except requests.RequestException:
                pass
            self._sid = self._session_base = None


_VIEW_FIELDS = ("session_id", "instruction", "goal_index", "observation", "available_actions", "url", "page",
                "done", "reward")


def _session_base(view: dict[str, Any]) -> str | None:
    """The worker address a session view names (``session_url``), if it is an http(s) URL."""
    url = view.get("session_url")
    return url.rstrip("/") if isinstance(url, str) and url.startswith(("http://", "https://")) else None


def _error_text(text: str) -> str:
    """The ``error`` field of a JSON error answer, else the text's start."""
    try:
        return str(json.loads(text)["error"])
    except (ValueError, KeyError, TypeError):
        return text[:300]


def check_connect_retries(value: Any) -> None:
    """ValueError naming ``connect_retries`` unless it is an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"connect_retries must be an int >= 0, got {value!r}")


def _finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


_OPTION_PAGES = ("item_page", "item_sub_page", "done")


def selected_options(url: str) -> dict[str, str]:
    """The options chosen on the current item, from the page URL (the original WebShop's scheme:
    ``/item_page/<sid>/<asin>/<keywords>/<page>/<options>``, ``/item_sub_page/.../<options>``,
    ``/done/<sid>/<asin>/<options>``, the options a quoted Python dict); ``{}`` on other pages or when
    the last part is not a dict."""
    parts = url.split("?", 1)[0].split("/")
    if len(parts) < 3 or parts[1] not in _OPTION_PAGES:
        return {}
    try:
        value = ast.literal_eval(unquote(parts[-1]))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def options_text(options: dict[str, str]) -> str:
    """``info["state_extra"]``: the chosen options sorted by name (the click order does not matter)."""
    if not options:
        return "Selected options: none."
    return "Selected options: " + ", ".join(f"{k}: {v}" for k, v in sorted(options.items())) + "."
def admissible_actions(available: dict[str, Any]) -> list[str]:
    """The agent's action list for a page: ``search[<your query>]`` when it has a search bar, then
    ``click[label]`` per clickable (not ``search``), each label in ``normalize_action`` form.

    The agent's parser normalises every action with the same function and the server resolves a
    click after it too (``envs.webshop_server.engine.resolve_clickable``), so each listed action is
    exactly what a model that copies it sends. Labels equal after normalisation are listed once.

    Args:
        available: the server's ``available_actions`` (``has_search_bar``, ``clickables``).
    """
    admissible = [SEARCH_MARKER] if available["has_search_bar"] else []
    labels = dict.fromkeys(normalize_action(c) for c in available["clickables"])
    return admissible + [f"click[{c}]" for c in labels if c not in ("search", "")]


def anchor_text(observation: str, instruction: str) -> str:
    """The observation without everything up to and including the instruction (and its separator)."""
    pos = observation.find(instruction)
    if pos < 0:
        return observation
    rest = observation[pos + len(instruction):]
    for sep in (" [SEP] ", "\n"):
        if rest.startswith(sep):
            return rest[len(sep):]
    return rest.lstrip()
