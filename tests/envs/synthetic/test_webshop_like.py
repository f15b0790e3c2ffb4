"""The WebShop-like family: reward by hand, exact values of a hand-solved instance, Monte Carlo, aliasing."""

from __future__ import annotations

import numpy as np
import pytest

from research.oracle import ExactOracle
from progpo.envs.synthetic.webshop_like import ShopConfig, ShopTask


def _task(**kw) -> ShopTask:
    return ShopTask(ShopConfig(**kw), seed=11)


def test_reward_is_webshops_partial_score():
    t = _task()
    target, c, s = t.items[0], t.items[0].colors.index(t.color), t.items[0].sizes.index(t.size)
    assert t.score(("item", 0, c, s)) == 1.0
    assert t.score(("item", 0, -1, -1)) == pytest.approx(0.5)  # attribute and price only
    assert t.score(("item", 2, c, s)) == pytest.approx(0.75)  # too expensive
    other = t.items[4]
    assert other.category != t.category
    assert t.score(("item", 4, -1, -1)) == pytest.approx(0.1 * 2 / 4)  # wrong category: r_type 0.1
    buy = t.outcomes(("item", 0, c, s), "click[buy now]")
    assert len(buy) == 1 and buy[0].terminated and buy[0].reward == pytest.approx(10.0)
    assert target.price <= t.budget < t.items[2].price


class _ItemPageMDP:
    """From the target's item page: pi(click goal color) = pi(buy) = 1/2; after the click, buy.

    By hand (gamma 1/2, horizon 3): Q(buy) = 10 * (1 + 0 + 0 + 1) / 4 = 5; Q(click color) = 0 + 1/2 *
    10 * (1 + 1 + 0 + 1) / 4 = 3.75; V_0 = (5 + 3.75) / 2 = 4.375; A*(buy) = +0.625, A*(click) = -0.625.
    """

    horizon, gamma, history = 3, 0.5, 0

    def __init__(self) -> None:
        self.task = _task()
        self.click = f"click[{self.task.color}]"

    def initial(self):
        s = ("item", 0, -1, -1)
        return [(1.0, s, self.task._page_texts(0)[0])]

    def policy(self, state, obs, hist):
        if state[2] < 0:
            return [(self.click, 0.5), ("click[buy now]", 0.5)]
        return [("click[buy now]", 1.0)]

    def outcomes(self, state, action):
        return self.task.outcomes(state, action)


def test_hand_solved_item_page():
    mdp = _ItemPageMDP()
    orc = ExactOracle(mdp)
    start = int(orc.init_nodes[0])
    assert orc.start_value() == pytest.approx(4.375)
    assert orc.q_value(0, orc.sa_index(start, "click[buy now]")) == pytest.approx(5.0)
    assert orc.q_value(0, orc.sa_index(start, mdp.click)) == pytest.approx(3.75)
    assert orc.advantage(0, orc.sa_index(start, "click[buy now]")) == pytest.approx(0.625)
    assert orc.advantage(0, orc.sa_index(start, mdp.click)) == pytest.approx(-0.625)


def test_behaviour_policy_matches_monte_carlo():
    cfg = ShopConfig(horizon=8)
    orc = ExactOracle(ShopTask(cfg, seed=5))
    rng = np.random.default_rng(0)
    rets = [sum(cfg.gamma ** s.t * orc.out_reward[s.outcome] for s in orc.sample(rng)) for _ in range(4000)]
    se = np.std(rets) / np.sqrt(len(rets))
    assert abs(np.mean(rets) - orc.start_value()) < 5 * se + 1e-9
    for node in range(0, orc.num_nodes, 53):  # sum_a pi A* = 0
        lo, hi = orc.node_sa_ptr[node], orc.node_sa_ptr[node + 1]
        assert sum(orc.sa_pi[sa] * orc.advantage(1, sa) for sa in range(lo, hi)) == pytest.approx(0.0, abs=1e-9)


def test_option_pages_alias_the_other_selection():
    """After clicking the goal size, the text is the same whatever color was clicked; the state extra differs."""
    t = _task(n_variants=1)
    it = t.items[0]
    size = f"click[{t.size}]"
    c_goal, c_other = it.colors.index(t.color), next(i for i, c in enumerate(it.colors) if c != t.color)
    good = t.outcomes(("item", 0, c_goal, -1), size)[0]
    bad = t.outcomes(("item", 0, c_other, -1), size)[0]
    assert good.obs == bad.obs
    assert t.state_extra(good.next_state) != t.state_extra(bad.next_state)
    assert t.score((*good.next_state[:2], *good.next_state[2:])) == 1.0 > t.score(bad.next_state)


def test_bad_config_is_refused_by_name():
    with pytest.raises(ValueError, match="search_noise"):
        ShopConfig(search_noise=1.0)
    with pytest.raises(ValueError, match="n_colors"):
        ShopConfig(n_colors=9)


# ----------------------------------------------------------------------------- longer searches (n_items > 6)
def _long(seed: int = 11, **kw) -> ShopTask:
    return ShopTask(ShopConfig(n_items=12, n_colors=4, n_sizes=4, **kw), seed=seed)


@pytest.mark.parametrize("seed, titles, prices, goal, priors", [
    (0, ("Brio wireless water bottle", "Kestrel wireless water bottle", "Zephyr wireless water bottle",
         "Lumen recycled water bottle", "Orbit wireless backpack", "Tandem recycled backpack"),
     (34.87, 50.0, 62.68, 25.52, 25.4, 35.65),
     "i need a wireless water bottle in grey, size xx-large, price lower than 40.00 dollars",
     {"search[wireless water bottle grey]": 0.422804, "search[water bottle]": -0.217786, "search[backpack]": 1.175403}),
    (1, ("Acme wireless sneakers", "Tandem wireless sneakers", "Vela wireless sneakers", "Quill leather sneakers",
         "Zephyr wireless t-shirt", "Northwind leather t-shirt"),
     (30.92, 54.48, 52.45, 26.85, 17.9, 30.18),
     "i need a wireless sneakers in olive, size one size, price lower than 40.00 dollars",
     {"search[wireless sneakers olive]": -0.088453, "search[sneakers]": -0.022148, "search[t-shirt]": 0.084846}),
])
def test_six_items_are_the_original_tasks(seed, titles, prices, goal, priors):
    """Values written down from the generator before longer searches existed (commit 365db81's parent)."""
    t = ShopTask(ShopConfig(), seed)
    assert tuple(it.title for it in t.items) == titles and tuple(it.price for it in t.items) == prices
    assert t.goal_text == goal and t.pages == 2
    assert t.rankings == (((0.7, (0, 1, 2, 3, 4, 5)), (0.3, (1, 2, 3, 0, 4, 5))),
                          ((0.7, (1, 0, 3, 2, 4, 5)), (0.3, (3, 2, 1, 0, 4, 5))),
                          ((0.7, (4, 5, 3, 2, 1, 0)), (0.3, (4, 5, 0, 1, 2, 3))))
    assert {a: round(t.prior[a], 6) for a in priors} == priors


@pytest.mark.parametrize("seed", range(8))
def test_longer_search_keeps_the_original_draws(seed):
    """The look-alikes come from a stream of their own: the first six items, the goal and the prior of every
    original action are the draws of ``n_items = 6``."""
    short, long = ShopTask(ShopConfig(n_colors=4, n_sizes=4), seed), _long(seed)
    assert long.items[:6] == short.items and long.goal_text == short.goal_text
    assert all(long.prior[a] == p for a, p in short.prior.items())
    assert len(long.items) == 12 and long.pages == 4


@pytest.mark.parametrize("seed", range(8))
def test_lookalikes_match_the_target_until_their_item_page(seed):
    """Every extra item has the target's title words and a price under the budget, so the shared features of
    clicking it on a results page equal those of clicking the target; its item page lacks the goal color
    (even extras) or the goal size (odd)."""
    from progpo.envs.synthetic.families import FAMILIES

    fam, t = FAMILIES["webshop"], _long(seed)
    target = t.items[0]
    ranking = t.rankings[0][0][1]
    assert 0 in ranking[:3]  # precise, clean: the target on page 1, beside two look-alikes
    assert set(ranking[:3]) - {0} <= set(range(6, 12))
    obs = t._results(0, 0, 1)[0]
    feats = {fam.features(t.goal_text, obs, f"click[{t.items[i].title}]") for i in ranking[:3]}
    assert len(feats) == 1
    for k, it in enumerate(t.items[6:]):
        assert it.title.split()[1:] == target.title.split()[1:] and it.price <= t.budget
        assert (t.color not in it.colors) if k % 2 == 0 else (t.size not in it.sizes)
        assert (t.size in it.sizes) if k % 2 == 0 else (t.color in it.colors)


@pytest.mark.parametrize("n_items", [9, 12, 15])
@pytest.mark.parametrize("seed", range(4))
def test_expert_turns_to_the_target_from_every_page(seed, n_items):
    """Every ranking is a permutation of the items; from every page of every ranking the expert turns straight to
    the target's page (next before it, prev after it), opens it and buys it with both goal options: 10."""
    t = ShopTask(ShopConfig(n_items=n_items, n_colors=4, n_sizes=4), seed)
    rng = np.random.default_rng(seed)
    for q in range(3):
        for r in range(2):
            assert sorted(t.rankings[q][r][1]) == list(range(n_items))
            target_page = next(p for p in range(1, t.pages + 1) if 0 in t._page(q, r, p))
            for start in range(1, t.pages + 1):
                state, turns = ("results", q, r, start), 0
                for _ in range(20):
                    out = t.step(state, t.expert_action(state), rng)
                    if out.terminated:
                        break
                    turns += out.next_state[0] == "results"
                    state = out.next_state
                assert out.terminated and out.reward == pytest.approx(10.0)
                assert turns == abs(target_page - start)


def test_pages_turn_both_ways_and_say_how_many():
    t = _long(n_variants=2)
    assert t.admissible(("results", 0, 0, 1))[3:] == ["click[next >]", "click[back to search]"]
    assert t.admissible(("results", 0, 0, 2))[3:] == ["click[next >]", "click[< prev]", "click[back to search]"]
    assert t.admissible(("results", 0, 0, 4))[3:] == ["click[< prev]", "click[back to search]"]
    assert t.outcomes(("results", 0, 0, 2), "click[< prev]")[0].next_state == ("results", 0, 0, 1)
    assert t.outcomes(("results", 0, 0, 2), "click[next >]")[0].next_state == ("results", 0, 0, 3)
    assert "page 3 of 4 (12 results)" in t._results(0, 0, 3)[1]
    assert "page 1 of 2 (6 results)" in ShopTask(ShopConfig(n_variants=2), 11)._results(0, 0, 1)[1]
    from progpo.envs.synthetic.families import _shop_page  # the learner's features read every page of a long search

    for page in range(1, t.pages + 1):
        for text in t._results(0, 0, page):
            kind, fields = _shop_page(text)
            assert kind == "results" and fields["page"] == str(page), text


@pytest.mark.parametrize("win_only, paid", [(False, 7.5), (True, 0.0)])
def test_lookalike_purchase_pays_partial_or_nothing(win_only, paid):
    """A look-alike bought after clicking the goal option it has scores 0.75: 7.5 with WebShop's partial
    reward, 0 with verl-agent's win/lose reward; the target with both goal options pays 10 either way."""
    t = _long(win_only=win_only)
    it = t.items[6]  # lacks the goal color, has the goal size
    state = ("item", 6, -1, it.sizes.index(t.size))
    assert t.outcomes(state, "click[buy now]")[0].reward == pytest.approx(paid)
    goal = ("item", 0, t.items[0].colors.index(t.color), t.items[0].sizes.index(t.size))
    assert t.outcomes(goal, "click[buy now]")[0].reward == pytest.approx(10.0)


def test_bad_item_count_is_refused_by_name():
    with pytest.raises(ValueError, match="n_items"):
        ShopConfig(n_items=7)
