"""Action parser rules, per env (valid and invalid cases)."""

from __future__ import annotations

import pytest

from progpo.agents.parsing import parse_action, parse_actions

THINK = "<think>the mug is on the sink, so I should go there</think>"


@pytest.mark.parametrize(
    "text, action",
    [
        (f"{THINK}<action>go to sinkbasin 1</action>", "go to sinkbasin 1"),
        (f"{THINK}\n<action>  Go To  SinkBasin 1 \n</action>", "go to sinkbasin 1"),
        (f"{THINK}<ACTION>take mug 2 from sinkbasin 1</ACTION>", "take mug 2 from sinkbasin 1"),
        (f"  {THINK} some words <action>look</action> trailing", "look"),
        # line breaks are whitespace: the env receives "go to desk 1", one command of its grammar
        (f"{THINK}<action>go to\ndesk 1</action>", "go to desk 1"),
    ],
)
def test_alfworld_valid(text: str, action: str) -> None:
    assert parse_action(text, "alfworld") == (action, True)


@pytest.mark.parametrize(
    "text, sent",
    [
        ("go to sinkbasin 1", "go to sinkbasin 1"),  # no tags at all: raw response is sent
        ("<action>go to sinkbasin 1</action>", "go to sinkbasin 1"),  # missing think
        (f"{THINK}<action>go to sinkbasin 1", f"{THINK}<action>go to sinkbasin 1"),  # unclosed
        (f"{THINK}<action></action>", ""),  # empty action
        (f"{THINK}<action>look</action><action>inventory</action>", "look"),  # two actions
        (f"{THINK}{THINK}<action>look</action>", "look"),  # two think blocks
        ("<action>look</action><think>why</think>", "look"),  # wrong order
        (f"{THINK}<action>go to desk 1\nopen drawer 1</action>", "go to desk 1 open drawer 1"),  # two commands
        (f"{THINK}<action>我 look</action>", "我 look"),  # CJK characters (verl-agent's language rule)
        ("<think>我 look</think><action>look</action>", "look"),  # the rule holds in the reasoning too
        (f"<think>a <action>look</action></think>", "look"),  # action nested in think
    ],
)
def test_alfworld_invalid(text: str, sent: str) -> None:
    assert parse_action(text, "alfworld") == (sent, False)


@pytest.mark.parametrize(
    "text, action",
    [
        (f"{THINK}<action>search[red cotton t-shirt under 30 dollars]</action>",
         "search[red cotton t-shirt under 30 dollars]"),
        (f"{THINK}<action>click[B09QKP7XQL]</action>", "click[b09qkp7xql]"),
        (f"{THINK}<action>click[Buy Now]</action>", "click[buy now]"),
        (f"{THINK}<action>click[< prev]</action>", "click[< prev]"),
        # the server's parser reads a blank label as a click of " " (then: not on the page, env-invalid)
        (f"{THINK}<action>click[  ]</action>", "click[ ]"),
        # any script the pages hold: no language rule on WebShop (its labels and goals hold CJK; issue 34)
        (f"{THINK}<action>click[财48 - Wine]</action>", "click[财48 - wine]"),
        ("<think>我要 1.8米</think><action>click[1.8米]</action>", "click[1.8米]"),
        (f"{THINK}<action>search[<b>café</b> ［mug］ 🍵]</action>", "search[<b>café</b> ［mug］ 🍵]"),
        (f"{THINK}<action>search[red\nshoes]</action>", "search[red shoes]"),
    ],
)
def test_webshop_valid(text: str, action: str) -> None:
    assert parse_action(text, "webshop") == (action, True)


@pytest.mark.parametrize(
    "text",
    [
        f"{THINK}<action>buy now</action>",  # not search[...] / click[...]
        f"{THINK}<action>search[]</action>",  # empty query
        f"{THINK}<action>click[[x]]</action>",  # the server reads the name "click[" (tests/agents/test_env_grammar.py)
        f"{THINK}<action>search red shirt</action>",
        f"{THINK}<action>search[red shirt] please</action>",
        f"{THINK}<action>open[item]</action>",
        "search[red shirt]",  # no tags
        f"{THINK}<action>click[item]</action><action>click[buy now]</action>",
    ],
)
def test_webshop_invalid(text: str) -> None:
    _, valid = parse_action(text, "webshop")
    assert valid is False


def test_batch_is_order_preserving_and_pure() -> None:
    texts = [f"{THINK}<action>look</action>", "nonsense", f"{THINK}<action>inventory</action>"]
    before = list(texts)
    actions, valid = parse_actions(texts, "alfworld")
    assert actions == ["look", "nonsense", "inventory"]
    assert valid == [True, False, True]
    assert texts == before
    assert parse_actions([], "webshop") == ([], [])


def test_bad_input_names_the_problem() -> None:
    with pytest.raises(ValueError, match="unknown env 'sokoban'; registered"):
        parse_actions(["x"], "sokoban")
    with pytest.raises(ValueError, match=r"texts\[1\]"):
        parse_actions(["x", None], "alfworld")  # type: ignore[list-item]
