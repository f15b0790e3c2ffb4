"""Clickable labels and the agent's action normalisation: whatever the parser does to an action, the
env does to its labels (one shared function), so every label on every page can be clicked.

Labels of the 87 real products are all in normal form already (none has a whitespace run, a tab or
upper case: counted below); the synthetic catalog adds the labels the full 1.18M catalog has, e.g.
``"Black / White"`` -> ``"black  |  white"`` (the original's ``/`` -> `` | `` rule doubles the
spaces), tabs, non-breaking spaces and upper case.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from envs.webshop_server import engine
from envs.webshop_server.engine import PageState, resolve_clickable
from envs.webshop_server.shop import Shop, ShopConfig
from progpo.agents import parsing
from progpo.agents.parsing import parse_action
from progpo.envs import alfworld, base
from progpo.envs.base import normalize_action
from progpo.envs.webshop import admissible_actions
from progpo_tests.patience import PATIENCE_S

#: how a model may copy a label: verbatim, upper case, doubled spaces, tabs, NBSP, padded
VARIANTS = {
    "verbatim": lambda s: s,
    "upper": str.upper,
    "double spaces": lambda s: s.replace(" ", "  "),
    "tabs": lambda s: s.replace(" ", "\t"),
    "nbsp": lambda s: s.replace(" ", "\u00a0"),
    "padded": lambda s: f"  {s} ",
}


def agent_action(label: str) -> str:
    """What the env receives when the model answers ``click[label]`` (through the real parser)."""
    action, valid = parse_action(f"<think>pick it</think><action>click[{label}]</action>", "webshop")
    assert valid, label
    return action


def test_one_normalisation_on_both_sides():
    assert parsing.normalize_action is base.normalize_action  # the agent's parser
    # the server's click resolution: its own copy of the rule (it imports no training code), the same function
    assert alfworld.normalize_action is base.normalize_action  # ALFWorld's admissibility check
    cases = {
        "black  |  white": "black | white",
        "Navy\tBlue": "navy blue",
        "size\u00a0XL": "size xl",
        " Click[Buy  Now]\n": "click[buy now]",
        "\u2003em\u2009space": "em space",
        "": "",
    }
    for raw, want in cases.items():
        assert normalize_action(raw) == want == engine.normalize_action(raw)
        assert normalize_action(want) == want  # idempotent


def test_resolution_exact_first_then_normalised_in_page_order():
    labels = ["back to search", "red  blue", "red blue", "black  |  white", "navy\tblue", "size\u00a0xl",
              "a\tb", "a  b"]
    assert resolve_clickable("red  blue", labels) == "red  blue"  # the original's exact rule wins
    assert resolve_clickable("red blue", labels) == "red blue"
    assert resolve_clickable(" red\tblue ", labels) == "red blue"  # no exact match: the normal-form label
    assert resolve_clickable("a b", labels) == "a\tb"  # none in normal form: the first in page order
    assert resolve_clickable("black | white", labels) == "black  |  white"
    assert resolve_clickable("navy blue", labels) == "navy\tblue"
    assert resolve_clickable("size xl", labels) == "size\u00a0xl"
    assert resolve_clickable("black white", labels) is None  # normalisation joins nothing new
    assert resolve_clickable("search", labels + ["search"]) == "search"  # refused by the caller


# ----- the 87 real products ----------------------------------------------------------------------
def _at(shop: Shop, state: PageState):
    session = shop.create_session(0)
    session.set_state(copy.deepcopy(state))
    return session


def _check_page(shop: Shop, state: PageState) -> set[str]:
    """Click every label of the page at ``state`` the way a model would; returns the labels."""
    probe = _at(shop, state)
    labels = [c for c in probe.actions["clickables"] if c != "search"]
    listed = admissible_actions(probe.actions)
    shop.close_session(probe.sid)
    for action in listed:  # the list the model sees is a fixed point of the parser
        if action.startswith("click["):
            assert agent_action(action[6:-1]) == action
    for label in labels:
        want = resolve_clickable(label, labels)
        assert want == label
        if label == "buy now":  # resolution only: a purchase per variant would cost a spaCy parse each
            assert all(resolve_clickable(agent_action(v(label))[6:-1], labels) == label for v in VARIANTS.values())
            continue
        exact = _at(shop, state)
        assert exact.step(f"click[{label}]")["valid"]
        for name, variant in VARIANTS.items():
            session = _at(shop, state)
            result = session.step(agent_action(variant(label)))
            assert result["valid"], (name, label, result["message"])
            assert session.state == exact.state, (name, label)
            shop.close_session(session.sid)
        shop.close_session(exact.sid)
    return set(labels)


def test_every_label_of_the_real_products_is_clickable_by_the_agent(shop):
    products = shop.catalog.products
    assert len(products) == 87
    seen: set[str] = set()
    options = {v for p in products for values in p["options"].values() for v in values}
    unnormal = sorted(v for v in options if normalize_action(v) != v)
    for product in products:
        asin = product["asin"]
        keywords = product["Title"].lower().split(" ")
        hits = shop.search(" ".join(keywords))
        assert asin in hits[:50], asin
        page = hits.index(asin) // engine.PRODUCT_WINDOW + 1
        seen |= _check_page(shop, PageState("search_results", keywords, page))
        seen |= _check_page(shop, PageState("item_page", keywords, page, asin, {}))
        seen |= _check_page(shop, PageState("item_sub_page", keywords, page, asin, {}, "Features"))
    assert {p["asin"].lower() for p in products} <= seen
    assert options <= seen
    assert {"back to search", "< prev", "description", "features", "reviews", "buy now"} <= seen
    print(f"\n{len(seen)} distinct labels clicked x {len(VARIANTS)} variants; "
          f"{len(options)} option values, {len(unnormal)} not in normal form: {unnormal}")


# ----- synthetic labels: whitespace runs, tabs, NBSP, case, CJK and accents ----------------------------
RAW_COLORS = ["Black / White", "Navy\tBlue", "Size\u00a0XL", "Light  Grey", "DARK Red", "Red  Blue", "Red Blue",
              "财48 - Wine", "1.8米", "Café ［Noir］ ☕"]  # labels of WebShop's full catalog (issue 34), accents
RAW_SIZES = ["X-Large", "2  Pack"]


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory, shared_data) -> Path:
    """A data folder with 3 synthetic products (real product 0 as template) carrying odd labels."""
    real = json.loads((shared_data / "webshop" / "items_shuffle_prefix.json").read_text())
    template = next(p for p in real if p["asin"] == "B06Y3VLDFB")
    products, attributes = [], {}
    for k in range(3):
        p = copy.deepcopy(template)
        p["asin"] = f"B0SYNTH{k:03d}"
        p["name"] = f"Synthetic Label Test Shirt {k}"
        p["customization_options"] = {
            "Color": [{"value": v, "image": None} for v in RAW_COLORS],
            "Size": [{"value": v, "image": None} for v in RAW_SIZES],
        }
        products.append(p)
        attributes[p["asin"]] = {"attributes": ["cotton"], "instruction": "i want a synthetic label test shirt",
                                 "instruction_attributes": ["cotton"]}
    folder = tmp_path_factory.mktemp("webshop_labels")
    (folder / "items_shuffle_prefix.json").write_text(json.dumps(products))
    (folder / "items_ins_v2_1000.json").write_text(json.dumps(attributes))
    return folder


def test_synthetic_labels_with_odd_whitespace_and_case_are_clickable(synthetic_dir):
    shop = Shop(ShopConfig(data_dir=str(synthetic_dir), preload_nlp=False, use_cache=False))
    product = shop.catalog.by_asin["B0SYNTH000"]
    colors = product["options"]["color"]
    assert "black  |  white" in colors and "navy\tblue" in colors and "size\u00a0xl" in colors
    state = PageState("item_page", ["shirt"], 1, "B0SYNTH000", {})
    clicked = {}
    for name, values in product["options"].items():
        for value in values:
            for variant_name, variant in VARIANTS.items():
                session = _at(shop, state)
                result = session.step(agent_action(variant(value)))
                assert result["valid"], (variant_name, value, result["message"])
                got = session.state.options[name]
                # labels equal after normalisation: the agent reaches the one in normal form
                assert normalize_action(got) == normalize_action(value), (variant_name, value, got)
                clicked.setdefault(value, set()).add(got)
                shop.close_session(session.sid)
    assert clicked["black  |  white"] == {"black  |  white"}
    assert clicked["navy\tblue"] == {"navy\tblue"} and clicked["size\u00a0xl"] == {"size\u00a0xl"}
    assert clicked["light  grey"] == {"light  grey"} and clicked["2  pack"] == {"2  pack"}
    assert clicked["dark red"] == {"dark red"}
    assert clicked["财48 - wine"] == {"财48 - wine"} and clicked["1.8米"] == {"1.8米"}
    assert clicked["café ［noir］ ☕"] == {"café ［noir］ ☕"}
    assert clicked["red  blue"] == {"red blue"}  # its normal form is the other label's exact text


@pytest.mark.parametrize("color", ["black  |  white", "财48 - wine", "1.8米"])
def test_agent_buys_goal_with_odd_option_over_http(synthetic_dir, color):
    """End to end (server process + WebShopEnv): the model copies actions from the admissible list,
    the parser normalises them, and the goal with option ``color`` (a double-spaced label, or the CJK labels
    of issue 34) is bought with score 1."""
    from envs.webshop_server.process import WebShopServerProcess
    from envs.webshop_server.reward import get_reward
    from progpo.envs.webshop import WebShopEnv

    shop = Shop(ShopConfig(data_dir=str(synthetic_dir), preload_nlp=False, use_cache=False))
    lo, hi = shop.splits.range("train")
    index, goal = next((i - lo, shop.goals[i]) for i in range(lo, hi)
                       if shop.goals[i]["goal_options"].get("color") == color)
    product = shop.catalog.by_asin[goal["asin"]]
    assert get_reward(product, goal, shop.catalog.prices[goal["asin"]], goal["goal_options"])[0] == 1.0
    with WebShopServerProcess(data_dir=synthetic_dir, port=0, threads=2, start_timeout_s=PATIENCE_S,
                              extra_args=["--no-cache"]) as server:
        env = WebShopEnv(server.url, timeout_s=PATIENCE_S)
        env.reset(split="train", index=index)
        res = env.step("search[synthetic label test shirt]")
        steps = [f"click[{goal['asin'].lower()}]"] + [f"click[{v}]" for v in goal["goal_options"].values()]
        for wanted in steps:
            listed = [a for a in res.info["admissible_actions"] if normalize_action(a) == normalize_action(wanted)]
            assert len(listed) == 1, (wanted, res.info["admissible_actions"])
            sent = agent_action(listed[0][6:-1])
            assert sent == listed[0]  # the listed action is exactly what the parser produces
            res = env.step(sent)
            assert not res.info["invalid_action"], (sent, res.info["message"])
        res = env.step(agent_action("Buy Now"))
        env.close()
    assert res.terminated and res.info["score"] == 1.0, res.info["reward_breakdown"]
