"""Every boundary comparison of the WebShop reward, tested AT its boundary (through ``get_reward``).

The 300 reference cases (test_reward.py) never put a value exactly on a bound, so ``<=`` vs ``<`` or
``> 85`` vs ``>= 85`` would pass them. The original's rules (``web_agent_site/engine/goal.py``):
price ``<= price_upper``; category match ``>= 2`` shared levels; r_type drops to 0.5 unless
``title_score > 0.2`` (or a query/category match), to 0.1 when ``title_score < 0.1``; an attribute or
option matches when ``fuzz.token_set_ratio > 85``.
"""

from __future__ import annotations

import pytest
from thefuzz import fuzz

from envs.webshop_server import reward
from envs.webshop_server.catalog import load_catalog
from envs.webshop_server.goals import synthetic_goals
from envs.webshop_server.reward import get_reward


@pytest.fixture(scope="module")
def goal_125(webshop_dir):
    """Synthetic goal 125 (unshuffled order, as the reference cases index goals) and its product."""
    catalog, rng = load_catalog(webshop_dir)
    goal = synthetic_goals(catalog.products, catalog.prices, rng)[125]
    return goal, catalog.by_asin[goal["asin"]]


def test_price_exactly_at_the_bound_is_within_it(goal_125):
    goal, product = goal_125
    assert goal["asin"] == "B08QRHVS6N" and goal["price_upper"] == 70.0
    total, info = get_reward(product, goal, 70.0, dict(goal["goal_options"]))
    assert info["r_price"] is True
    assert total == 1.0
    total, info = get_reward(product, goal, 70.01, dict(goal["goal_options"]))
    assert info["r_price"] is False
    assert total == pytest.approx(5 / 6)  # (3 attributes + 2 options + price 0) / 6, r_type 1


# ----- synthetic product and goal, title nouns given (no spaCy) --------------------------------------
def _product(**kw):
    base = {"name": "bought", "Title": "plain item", "BulletPoints": [], "Description": "", "Attributes": [],
            "query": "query b", "product_category": "b1 › b2 › b3"}
    return {**base, **kw}


def _goal(**kw):
    base = {"name": "wanted", "attributes": ["zzz"], "goal_options": [], "price_upper": 100.0,
            "query": "query g", "product_category": "g1 › g2 › g3"}
    return {**base, **kw}


@pytest.fixture
def nouns(monkeypatch):
    """Set the title nouns of the names ``bought`` and ``wanted`` (instead of spaCy's tags)."""
    table: dict[str, tuple[str, ...]] = {}
    monkeypatch.setattr(reward, "title_nouns", lambda title: table[title])
    return table


@pytest.mark.parametrize(("shared", "goal_nouns", "r_type"), [
    (1, 5, 0.5),    # title_score 0.2 exactly: not > 0.2, no query/category match -> 0.5
    (2, 5, 1.0),    # 0.4 > 0.2
    (1, 10, 0.5),   # 0.1 exactly: not < 0.1 -> stays 0.5
    (1, 11, 0.1),   # 0.0909 < 0.1
    (0, 5, 0.0),    # 0 -> 0
])
def test_title_score_bounds(nouns, shared, goal_nouns, r_type):
    wanted = tuple(f"n{k}" for k in range(goal_nouns))
    nouns["wanted"], nouns["bought"] = wanted, wanted[:shared] + ("other",)
    _, info = get_reward(_product(), _goal(), 1.0, {})
    assert info["title_score"] == pytest.approx(shared / goal_nouns)
    assert info["r_type"] == r_type


def test_category_match_at_exactly_two_shared_levels(nouns):
    nouns["wanted"], nouns["bought"] = ("n0", "n1", "n2", "n3", "n4"), ("n0", "x")  # title_score 0.2
    two = _product(product_category="g1 › g2 › b3")
    one = _product(product_category="g1 › b2 › b3")
    _, info = get_reward(two, _goal(), 1.0, {})
    assert info["category_match"] is True and info["r_type"] == 1.0
    _, info = get_reward(one, _goal(), 1.0, {})
    assert info["category_match"] is False and info["r_type"] == 0.5


# token_set_ratio exactly 85 and 86 (no colour word inside, so colour normalisation leaves them alone)
AT_85 = ("pack of twelve", "packf twelve")
AT_86 = ("long lasting", "long last")


def test_fuzzy_pairs_sit_on_the_threshold():
    assert fuzz.token_set_ratio(*AT_85) == 85 and fuzz.token_set_ratio(*AT_86) == 86
    assert all(reward.normalize_color(s) == s for s in AT_85 + AT_86)


@pytest.mark.parametrize(("pair", "matched"), [(AT_85, 0), (AT_86, 1)])
def test_attribute_match_needs_more_than_85(nouns, pair, matched):
    nouns["wanted"] = nouns["bought"] = ("n0",)
    wanted, offered = pair
    _, info = get_reward(_product(Attributes=[offered]), _goal(attributes=[wanted]), 1.0, {})
    assert info["r_att"] == matched


@pytest.mark.parametrize(("pair", "matched"), [(AT_85, 0), (AT_86, 1)])
def test_option_match_needs_more_than_85(nouns, pair, matched):
    nouns["wanted"] = nouns["bought"] = ("n0",)
    wanted, offered = pair
    total, info = get_reward(_product(), _goal(goal_options=[wanted]), 1.0, {"size": offered})
    assert info["r_option"] == matched
    assert total == pytest.approx((0 + matched + 1) / 3)  # attribute "zzz" unmatched, price ok
