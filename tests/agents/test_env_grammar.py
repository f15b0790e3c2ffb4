"""The answer-format check and each env's own grammar agree, in both directions.

One grammar per side: the training package's (each env spec's ``syntax``, ``progpo.agents.parsing``) and the env's
(the WebShop server's action parser, ``envs.webshop_server.engine.parse_action``; ALFWorld's command
templates in every game file). Nothing passes the check that the env reads as something other than
that one command, and every action the env lists (every label of the real catalog, a search for every
human and synthetic goal, every ALFWorld template, walkthrough command and object name) passes it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from envs.webshop_server import engine
from envs.webshop_server.catalog import load_catalog
from envs.webshop_server.goals import synthetic_goals
from progpo.agents.parsing import parse_action, syntax_check
from progpo.envs.alfworld import ALFWORLD_COMMANDS, ALFWORLD_NAME
from progpo.envs.base import normalize_action
from progpo.envs.webshop import SEARCH_MARKER, admissible_actions

webshop_ok = syntax_check("webshop")
alfworld_ok = syntax_check("alfworld")
THINK = "<think>the plan</think>"


# ----- WebShop ---------------------------------------------------------------------------------------
def server_reads_one_action(action: str) -> bool:
    """The server's own parser reads ``action`` as ONE search/click: its ``(name, arg)`` is
    ``search``/``click`` and the whole text is exactly ``name[arg]`` (``SessionEngine.step``)."""
    name, arg = engine.parse_action(action.strip())
    return arg is not None and name in ("search", "click") and action == f"{name}[{arg}]"


ISSUE_CASES = ["search[red shoes]search[blue shoes]", "click[b0123] click[buy now]", "search[[red] shoes]",
               "search[red shoes] then click[buy now]", "search[a]; search[b]"]


@pytest.mark.parametrize("answer", ISSUE_CASES)
def test_two_actions_or_nested_brackets_are_format_invalid(answer):
    """Each reads on the server as an action named e.g. ``search[red shoes]search``: an invalid no-op."""
    name, _ = engine.parse_action(answer)
    assert name not in ("search", "click")
    action, valid = parse_action(f"{THINK}<action>{answer}</action>", "webshop")
    assert action == answer and valid is False


def test_what_the_server_reads_as_one_action_passes():
    for action in ["search[red shoes]", "click[< prev]", "click[next >]", "search[shoes size 7]]",
                   "click[black | white]", "search[ ]"]:
        assert server_reads_one_action(action) and webshop_ok(action), action
    for action in ["search[]", "search red", "buy now", "open[x]", "search[red] shoes", "click[[x]]"]:
        assert not server_reads_one_action(action) and not webshop_ok(action), action


_PIECES = st.sampled_from(["search", "click", "[", "]", " ", "  ", "red", "Shoes", "b0123", ";", "then", "|",
                           "< prev", "next >", "&", "1", "\t"])
_ACTIONS = st.builds("{}[{}]".format, st.sampled_from(["search", "click", "Search", "buy", ""]),
                     st.lists(_PIECES, max_size=4).map("".join))


@given(st.lists(st.one_of(_ACTIONS, _PIECES), min_size=1, max_size=6).map("".join))
def test_check_equals_the_server_parser_on_any_text(text):
    action = normalize_action(text)  # what the episode loop sends
    assert webshop_ok(action) == server_reads_one_action(action)
    # end to end through the parser (no tags, CJK or newlines in these pieces)
    sent, valid = parse_action(f"{THINK}<action>{text}</action>", "webshop")
    assert sent == action
    assert valid == (action != "" and server_reads_one_action(action))


@pytest.fixture(scope="module")
def catalog(shared_data):
    return load_catalog(shared_data / "webshop")


def test_every_label_of_the_real_catalog_passes(catalog):
    """Every click the env can list on the 87 real products: product links, option values, buttons."""
    cat, _ = catalog
    labels = {p["asin"].lower() for p in cat.products}
    labels |= {v for p in cat.products for values in p["options"].values() for v in values}
    labels |= {engine.END_BUTTON, engine.NEXT_PAGE, engine.PREV_PAGE, engine.BACK_TO_SEARCH, *engine.SUB_PAGES}
    listed = admissible_actions({"has_search_bar": True, "clickables": sorted(labels)})
    assert listed[0] == SEARCH_MARKER and len(listed) == len(labels) + 1
    for action in listed:
        assert webshop_ok(action), action
        assert server_reads_one_action(action), action
        assert parse_action(f"{THINK}<action>{action}</action>", "webshop") == (action, True)
    print(f"\n{len(labels)} labels of the real catalog: all pass the check and the server's parser")


def test_a_search_for_every_goal_agrees_with_the_server(catalog, shared_data):
    """A search for each of the 12,087 human instructions and 489 synthetic ones: the check and the
    server agree; the only ones refused (a ``[`` inside) are refused by both."""
    cat, rng = catalog
    human = json.loads((shared_data / "webshop" / "human_goals.json").read_text())
    queries = [g if isinstance(g, str) else g["instruction_text"] for g in human]
    queries += [g["instruction_text"] for g in synthetic_goals(cat.products, cat.prices, rng)]
    assert len(queries) == 12087 + 489
    verdicts = Counter()
    for q in queries:
        action = normalize_action(f"search[{q}]")
        ok = webshop_ok(action)
        assert ok == server_reads_one_action(action), q
        verdicts[ok] += 1
    assert verdicts[False] == sum("[" in q for q in queries) == 1
    print(f"\nsearches: {verdicts[True]} pass both, {verdicts[False]} refused by both")


# ----- any Unicode: what the server reads as one command, the parser admits ------------------------------
#: issue 34: labels of WebShop's own pages and the words of goal #706 (``... 1.8米 capacity``), refused before
#: as "CJK characters" (verl-agent's language rule) although the server reads each as one command.
REPORTED = ["click[财48 - wine]", "click[1.8米]",
            "search[i need a microphone cable with a power amplifier and 1.8米 capacity]"]


@pytest.mark.parametrize("action", REPORTED)
def test_reported_non_ascii_actions_are_format_valid(action):
    assert server_reads_one_action(action)
    assert parse_action(f"{THINK}<action>{action}</action>", "webshop") == (action, True)
    # the model may quote the page in its reasoning too: the same words are no language switch on WebShop
    assert parse_action(f"<think>the page offers {action[6:-1]}</think><action>{action}</action>", "webshop")[1]


def test_goal_706_copied_into_a_search_is_format_valid(shared_data):
    goals = json.loads((shared_data / "webshop" / "human_goals.json").read_text())
    goal = goals[706] if isinstance(goals[706], str) else goals[706]["instruction_text"]
    assert "1.8米" in goal
    action = normalize_action(f"search[{goal}]")
    assert parse_action(f"<think>{goal}</think><action>search[{goal}]</action>", "webshop") == (action, True)


_ANSWER_TAG = re.compile(r"</?(?:think|action)>", re.IGNORECASE)
#: the answer format reserves its own four tags; no text inside the action block can hold one
_NO_TAG = lambda s: _ANSWER_TAG.search(s) is None  # noqa: E731
_UNICODE = st.one_of(
    st.text(),  # every code point but surrogates: controls, line and paragraph separators, private use
    st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF)),  # CJK ideographs
    st.text(st.characters(categories=("Mn", "Me"))),  # combining marks
    st.text(st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF)),  # emoji
    st.text(st.sampled_from("［］【】〔〕｛｝＜＞（）[]<> |\t\n\u3000\u00a0éüñ米财")),  # full-width and ASCII brackets
)
_PIECE = st.one_of(_UNICODE, st.sampled_from(["search", "click", "[", "]", " "]))
_LABEL = st.lists(_PIECE, max_size=5).map("".join).filter(_NO_TAG)


@given(name=st.sampled_from(["search", "click", "Search", "CLICK", "buy", "", "search ", "click[", "搜索"]),
       label=_LABEL)
def test_check_equals_the_server_on_any_unicode_label_or_query(name, label):
    """``name[label]`` with the label or query drawn from the whole of Unicode: the parser's verdict is the
    server's reading of what the episode loop sends (one search/click or not), nothing else."""
    answer = f"{name}[{label}]"
    sent, valid = parse_action(f"{THINK}<action>{answer}</action>", "webshop")
    assert sent == normalize_action(answer)
    assert valid == server_reads_one_action(sent), sent


@given(text=st.lists(_PIECE, min_size=1, max_size=6).map("".join).filter(_NO_TAG), think=_UNICODE.filter(_NO_TAG))
def test_check_equals_the_server_on_any_unicode_answer(text, think):
    sent, valid = parse_action(f"<think>{think}</think><action>{text}</action>", "webshop")
    assert sent == normalize_action(text)
    assert valid == server_reads_one_action(sent), sent


def test_every_title_option_and_goal_of_the_real_data_passes_the_parser(catalog, shared_data):
    """End to end through the parser (not only the syntax check): a click of every option value and a search
    for every product title and every human goal (CJK, curly quotes and accents included; goals #706 and #4165
    hold CJK) is valid exactly when the server reads it as one command."""
    cat, _ = catalog
    human = json.loads((shared_data / "webshop" / "human_goals.json").read_text())
    queries = [p["Title"] for p in cat.products] + [g if isinstance(g, str) else g["instruction_text"] for g in human]
    options = sorted({v for p in cat.products for values in p["options"].values() for v in values})
    answers = [f"search[{q}]" for q in queries] + [f"click[{v}]" for v in options]
    verdicts = Counter()
    for answer in answers:
        sent, valid = parse_action(f"<think>{answer}</think><action>{answer}</action>", "webshop")
        assert valid == server_reads_one_action(sent), answer
        verdicts[valid] += 1
    non_ascii = sum(any(ord(c) > 127 for c in a) for a in answers)
    assert verdicts[False] == sum("[" in q for q in queries) == 1
    assert non_ascii >= 80
    print(f"\n{len(answers)} titles, goals and options ({non_ascii} non-ASCII): {verdicts[True]} valid, "
          f"{verdicts[False]} refused by both")


# ----- ALFWorld --------------------------------------------------------------------------------------
_TEMPLATE = re.compile(r'template :: "([^"]*)"')
_PLACEHOLDER = re.compile(r"\[\{[^}]*\}\]|\{[a-z]+\}")  # "{o}", "{outerr}", go to's "[{r.name | ...}]"


@pytest.fixture(scope="module")
def alfworld_data(shared_data) -> dict:
    """What the check is compared with, read from every game file once (344 MB of JSON: ~2 s on an idle
    core, 10 s at load 25; only these small sets are kept): the template lines of each game, the walkthrough commands, the object names, and one
    game's grammar text (the env-side oracle of the property test)."""
    from progpo.envs.alfworld_data import resolve_data_dir

    files = sorted(resolve_data_dir().glob("*/*/*/game.tw-pddl"))
    templates: set[frozenset[str]] = set()
    walkthrough: set[str] = set()
    names: set[str] = set()
    grammar = ""
    for path in files:
        with path.open() as f:
            game = json.load(f)
        grammar = grammar or game["grammar"]
        templates.add(frozenset(_PLACEHOLDER.sub("{}", t) for t in _TEMPLATE.findall(game["grammar"])))
        walkthrough.update(game["walkthrough"])
        names |= _demangled_names(game["pddl_problem"])
    return {"n_games": len(files), "templates": templates, "walkthrough": walkthrough, "names": names,
            "grammar": grammar}


def _demangled_names(problem: str) -> set[str]:
    """A game's object names as ALFWorld's ``Demangler`` spells them (type, ``basin`` rule, numbers
    1..count), lower-cased as in its commands."""
    objects = problem[problem.index("(:objects"):problem.index("(:init")]
    counts = Counter()
    for line in objects.split("\n"):
        if "_bar_" in line:
            oid = line.strip().split()[0]
            counts[oid.split("_bar_", 1)[0].lower() + ("basin" if "basin" in oid else "")] += 1
    return {f"{name} {k}" for name, n in counts.items() for k in range(1, n + 1)}


def test_alfworld_grammar_is_every_games_grammar(alfworld_data):
    """Every game's command templates, placeholders read as ``{}``, are exactly ALFWORLD_COMMANDS;
    every walkthrough command and every object name of every game fits them."""
    assert alfworld_data["n_games"] == 4027
    assert alfworld_data["templates"] == {frozenset(ALFWORLD_COMMANDS)}
    names = alfworld_data["names"]
    assert all(re.fullmatch(ALFWORLD_NAME, n) for n in names), sorted(n for n in names if not re.fullmatch(ALFWORLD_NAME, n))
    for command in alfworld_data["walkthrough"]:
        assert alfworld_ok(command), command
    # each template with the first and the last name in every slot
    for template in ALFWORLD_COMMANDS:
        for name in (min(names), max(names)):
            assert alfworld_ok(template.replace("{}", name)), template
    print(f"\nALFWorld: {len(alfworld_data['walkthrough'])} walkthrough commands, {len(names)} object names, "
          f"{len(ALFWORLD_COMMANDS)} templates: all pass")


def _game_grammar_regex(grammar: str) -> re.Pattern:
    """The env side: one regex from a game's own template lines (not from ALFWORLD_COMMANDS)."""
    parts = []
    for t in sorted({_PLACEHOLDER.sub("\0", t) for t in _TEMPLATE.findall(grammar)}):
        parts.append(re.escape(t).replace("\0", r"[a-z]+ [0-9]+"))
    return re.compile("|".join(parts))


_WORDS = st.sampled_from(["go", "to", "take", "from", "move", "put", "in", "into", "on", "open", "close", "use",
                          "examine", "heat", "cool", "clean", "slice", "with", "look", "inventory", "help",
                          "mug", "desk", "sinkbasin", "1", "12", "and", "then", "the", ",", "."])


@given(words=st.lists(_WORDS, max_size=9))
def test_alfworld_check_equals_the_game_grammar_on_any_text(alfworld_data, words):
    game_grammar = _game_grammar_regex(alfworld_data["grammar"])
    text = normalize_action(" ".join(words))
    assert alfworld_ok(text) == (game_grammar.fullmatch(text) is not None)


@given(pieces=st.lists(st.one_of(_WORDS, _UNICODE, st.sampled_from(["Mug", "\u212aettle", "DESK", "\t", "\n"])),
                      max_size=9))
def test_alfworld_check_equals_the_game_grammar_on_any_unicode(alfworld_data, pieces):
    """Words of the grammar mixed with any Unicode (CJK, combining marks, emoji, full-width brackets, upper
    case, the Kelvin sign that lower-cases to ``k``): the parser's verdict is the games' grammar on what is
    sent. The games' names are ASCII, so the language rule (kept on ALFWorld) refuses nothing they admit."""
    text = " ".join(pieces)
    assume(_NO_TAG(text))
    game_grammar = _game_grammar_regex(alfworld_data["grammar"])
    sent, valid = parse_action(f"{THINK}<action>{text}</action>", "alfworld")
    assert sent == normalize_action(text)
    assert valid == (game_grammar.fullmatch(sent) is not None), sent


@pytest.mark.parametrize("answer", ["go to desk 1 and open drawer 1", "take mug 1 from desk 1, go to sinkbasin 1",
                                    "go to the desk 1", "go to desk", "go forward", "look around"])
def test_alfworld_answers_that_are_not_one_command_are_format_invalid(answer):
    _, valid = parse_action(f"{THINK}<action>{answer}</action>", "alfworld")
    assert valid is False
