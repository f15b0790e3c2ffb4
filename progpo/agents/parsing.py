"""Action parsing: model responses -> (actions sent to the env, validity mask). Pure functions.

The protocol (verl-agent / GiGPO): the model answers ``<think>...</think><action>...</action>``.
A response is **valid** when all of these hold:

* exactly one ``<think>`` ... ``</think>`` block and exactly one ``<action>`` ... ``</action>``
  block (tags matched case-insensitively, :data:`ANSWER_TAGS`), the think block closing before the
  action block opens;
* the language rule, where the env spec keeps it (``language_rule``: ALFWorld and the synthetic
  families): no CJK ideograph in the response (verl-agent's rule against language switches). WebShop
  turns it off: its own pages and goals hold CJK (``click[1.8米]``, goal #706), so the rule refused
  answers that click the env's own labels or copy its task;
* env syntax (the env spec's ``syntax``, :func:`syntax_check`) of the action text normalised by
  ``progpo.envs.base.normalize_action`` (stripped, lower-cased, every whitespace run, line breaks
  included, collapsed to one space; that is what is sent, and the envs match their labels after the
  same normalisation): the action is ONE command of the env's own grammar, so that a format-valid
  answer is exactly an answer the env's parser reads as that one command. Nothing else is asked of
  the action's characters: any script, bracket, emoji or markup the env reads as one command passes
  (``tests/agents/test_env_grammar.py`` draws them from the whole of Unicode). Each check lives in its env's
  module, next to the env (``progpo.envs.webshop.webshop_syntax_ok``, ``progpo.envs.alfworld.alfworld_syntax_ok``):

  - WebShop: ``search[<query>]`` or ``click[<label>]`` with at least one character inside the brackets
    and no ``[`` in it but as its last character. The server (``envs/webshop_server/engine.py``, the
    original's regex ``(.+)\\[(.+)\\]`` matched from the start, greedy) takes as the name everything up
    to the LAST ``[`` that still has an argument and a ``]`` after it: ``search[red shoes]search[blue
    shoes]``, ``search[[red] shoes]`` or ``search[a]; search[b]`` are read as an action named
    ``search[red shoes]search`` (etc.), an invalid no-op, and are format-invalid here; a ``]`` inside
    the argument, or a ``[`` right before the closing one (``search[x[]``), is read as part of it.
    Whether a clicked label is on the page, or a query is not too long, is the env's call.
  - ALFWorld: one instance of a command template of the games' grammar (``progpo.envs.alfworld.ALFWORLD_COMMANDS``,
    identical in every json_2.1.1 game), each ``{}`` an object name ``<type> <number>``
    (``take mug 2 from sinkbasin 1``). Whether it is admissible now is the env's call
    (``info["invalid_action"]``).

  ``tests/agents/test_env_grammar.py`` checks both directions against the env side (the server's
  parser; every game's templates, walkthroughs and admissible lists).

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

ANSWER_TAGS: tuple[str, ...] = ("<think>", "</think>", "<action>", "</action>")
"""The answer format's tags (matched case-insensitively). A tokenizer may hold them as ordinary text, added
tokens or special tokens; ``progpo.agents.templates.decode_response`` keeps them in every case."""

ANSWER_TAG = re.compile(r"<(/?)(think|action)>", re.IGNORECASE)
"""One answer tag (:data:`ANSWER_TAGS`, any case); group 1 is ``/`` for a closing tag, group 2 its name."""

_ACTION_BLOCK = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
_CJK = re.compile(r"[\u4e00-\u9fff]")

__all__ = ["ANSWER_TAG", "ANSWER_TAGS", "normalize_action", "parse_action", "parse_actions", "syntax_check"]


@functools.lru_cache(maxsize=None)
def syntax_check(env_name: str) -> Callable[[str], bool]:
    """The env's check that a normalised action is one command of its grammar (after the tag rules passed):
    its spec's ``syntax``.

    Raises:
        ValueError: unknown ``env_name`` (names the registered ones).
    """
    return spec(env_name).load("syntax")


def _tags_ok(text: str) -> bool:
    """Exactly one think and one action block, well nested, think before action."""
    tags = [(m.group(1) == "/", m.group(2).lower()) for m in ANSWER_TAG.finditer(text)]
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
    action = normalize_action(block.group(1))
    language_ok = not spec(env_name).language_rule or _CJK.search(text) is None
    return action, _tags_ok(text) and language_ok and check(action)


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
