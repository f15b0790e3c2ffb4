"""Action parsing: model responses -> (actions sent to the env, validity mask). Pure functions.

The protocol (verl-agent / GiGPO): the model answers ``<think>...</think><action>...</action>``.
A response is **valid** when all of these hold:

* exactly one ``<think>`` ... ``</think>`` block and exactly one ``<action>`` ... ``</action>``
  block (tags matched case-insensitively), the think block closing before the action block opens;
* the action text (normalised by ``progpo.envs.base.normalize_action``: stripped, lower-cased,
  every whitespace run collapsed to one space; the envs match their labels after the same
  normalisation, so any clickable or admissible action can be named) is non-empty, one line,
  holds no further tag, and no CJK characters appear in the response (verl-agent's language rule);
* env syntax: WebShop actions are ``search[<query>]`` or ``click[<target>]`` with non-empty
  brackets; ALFWorld actions are free text (admissibility is the env's job: it flags them).

Invalid responses are still sent to the env (the protocol does so; the env answers with its own
"nothing happens"), and the episode loop subtracts the invalid-action penalty. What is sent: the
normalised content of the first ``<action>`` block when there is one, else the whole response
stripped (the ``StepRecord.action`` contract).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

from progpo.envs.base import normalize_action
from progpo.envs.spec import spec

_TAG = re.compile(r"<(/?)(think|action)>", re.IGNORECASE)
_ACTION_BLOCK = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
_CJK = re.compile(r"[\u4e00-\u9fff]")
_WEBSHOP_ACTION = re.compile(r"^(search|click)\[(.+)\]$", re.DOTALL)
_ANY_TAG = re.compile(r"</?[a-z_]+>", re.IGNORECASE)


def webshop_syntax_ok(action: str) -> bool:
    """WebShop's answer syntax: ``search[<query>]`` or ``click[<target>]``, non-empty brackets (the spec's ``syntax``)."""
    m = _WEBSHOP_ACTION.match(action)
    return m is not None and m.group(2).strip() != ""


def alfworld_syntax_ok(action: str) -> bool:
    """ALFWorld's answer syntax: any one-line text (admissibility is the env's: ``info["invalid_action"]``)."""
    return True  # admissibility is checked by the env (info["invalid_action"])


__all__ = ["alfworld_syntax_ok", "normalize_action", "parse_action", "parse_actions", "syntax_check",
           "webshop_syntax_ok"]


@functools.lru_cache(maxsize=None)
def syntax_check(env_name: str) -> Callable[[str], bool]:
    """The env's check of a normalised action's syntax (after the tag rules passed): its spec's ``syntax``.

    Raises:
        ValueError: unknown ``env_name`` (names the registered ones).
    """
    return spec(env_name).load("syntax")


def _tags_ok(text: str) -> bool:
    """Exactly one think and one action block, well nested, think before action."""
    tags = [(m.group(1) == "/", m.group(2).lower()) for m in _TAG.finditer(text)]
    return tags == [(False, "think"), (True, "think"), (False, "action"), (True, "action")]


def parse_action(text: str, env_name: str) -> tuple[str, bool]:
    """Parse one response; see the module docstring for the rules.

    Args:
        text: the decoded model response.
        env_name: a registered env id (``progpo.envs``).

    Returns:
        ``(action, valid)``: the string to send to the env and whether it followed the protocol.

    Raises:
        ValueError: unknown ``env_name``.
    """
    check = syntax_check(env_name)
    block = _ACTION_BLOCK.search(text)
    if block is None:
        return text.strip(), False
    raw = block.group(1)
    action = normalize_action(raw)
    valid = (
        _tags_ok(text)
        and action != ""
        and "\n" not in raw.strip()
        and _ANY_TAG.search(raw) is None
        and _CJK.search(text) is None
        and check(action)
    )
    return action, valid


def parse_actions(texts: Sequence[str], env_name: str) -> tuple[list[str], list[bool]]:
    """Parse a batch of responses: ``texts [B] -> (actions [B], valid [B])``.

    Pure and order-preserving; see :func:`parse_action` and the module docstring.

    Raises:
        ValueError: unknown ``env_name``, or an element of ``texts`` that is not a str.
    """
    actions: list[str] = []
    valid: list[bool] = []
    for k, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"texts[{k}] must be str, got {type(t).__name__}")
        a, v = parse_action(t, env_name)
        actions.append(a)
        valid.append(v)
    return actions, valid
