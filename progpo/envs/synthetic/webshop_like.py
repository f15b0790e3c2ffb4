"""Seeded WebShop-like search-and-select tasks with exact truth (the second family of the benchmarks).

An instruction asks for a product ("i need a waterproof backpack in navy, size large, price lower
than 40.00 dollars"). The agent searches with one of three queries (precise, vague, off-target),
reads a results page (3 items per page, ``n_items / 3`` pages, 2 by default; the ranking is stochastic, so
the target may land on a later page or behind a look-alike), opens item pages, clicks option values (color, size) and buys. Buying
ends the episode with WebShop's partial reward (Yao et al. 2022, eq. 1, simplified to one attribute,
two options and the price):

    reward = success_reward * r_type * (attr + color + size + price) / 4

with ``r_type = 1`` for the goal category and 0.1 otherwise, each term 1 when it matches the goal
(attribute in the title, selected option equals the goal's, price below the budget). Success means
reward = ``success_reward`` (the target item with both goal options). ``win_only`` pays
``success_reward`` for a success and 0 for any other purchase instead, as verl-agent's WebShop wrapper
(the one GiGPO and G2PO train with) does.

**Longer searches (``n_items`` > 6).** Each further item is a look-alike of the target that a results page
tells from it by brand and price only: the target's title words (another brand), below the budget, but it
lacks the goal color (even extras) or the goal size (odd extras), which only its item page shows. The results
span ``n_items / 3`` pages. A precise query ranks the target on page 1 beside two look-alikes (clean ranking;
its slot drawn per task) or on the last page (noisy), after every look-alike. A vague query's page 1 is two
look-alikes and item 1; it ranks the target on page 2 (clean) or the last page. An off-target query ranks the
other category and the rejected items first, then the look-alikes, and the target on the last page under
both its rankings (they are the same ranking). So an agent opens items, reads their options, goes back and
searches again or turns pages, and buying a look-alike after clicking the option it has pays 0.75 of a
success (0 with ``win_only``). With ``n_items = 6`` the tasks are the original ones, draw for draw, the
expert included (past the target's page it goes back to search; with longer searches it turns back).

**How its states alias (unlike the ALFWorld-like family).** After an option click the observation is
"You have clicked <value>." followed by the item page, which does not show the other selections: the
page after clicking the goal size reads the same whether the goal color was clicked before or not
(or a wrong one), so the value of "buy now" from that text depends on hidden history. The state extra
(the ``inventory`` analogue, ``state_key = obs_inventory``) is the selected options
("Selected options: color navy, size large."). Two look-alike items (the target's title words, above
the budget; one also lacks the goal color and size) differ from the target on the results page only
by their price, and with 6 items a noisy search ranks them first.

State: ``("search",)``, ``("results", query, ranking, page)`` or ``("item", item, color, size)`` with
``color``/``size`` the selected option index or -1. Observations come in ``n_variants`` wordings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from progpo.envs.synthetic.behaviour import ExpertSoftmaxPolicy, PolicyConfig
from progpo.envs.synthetic.mdp import Outcome

CATEGORIES = ("backpack", "t-shirt", "sneakers", "hoodie", "jeans", "sandals", "jacket", "dress", "wallet",
              "sunglasses", "headphones", "water bottle")
ATTRIBUTES = ("waterproof", "cotton", "leather", "lightweight", "organic", "wireless", "recycled", "slim fit",
              "machine washable", "vegan")
COLORS = ("black", "navy", "red", "olive", "white", "grey", "beige", "pink", "teal", "brown")
SIZES = ("small", "medium", "large", "x-large", "one size", "xx-large")
BRANDS = ("Acme", "Northwind", "Zephyr", "Lumen", "Orbit", "Kestrel", "Tandem", "Vela", "Quill", "Brio")
#: brands of the look-alikes of longer searches (``n_items`` > 6), drawn from a stream of their own
EXTRA_BRANDS = ("Nimbus", "Sable", "Pico", "Ridge", "Halo", "Ember", "Fable", "Juno", "Mosaic")
NOTHING = "Invalid action."

_SEARCH = ("WebShop [SEP] Instruction: [SEP] {goal} [SEP] Search",
           "Amazon-like shop. Instruction: {goal}. You can search the catalogue.",
           "Shop home page [SEP] {goal} [SEP] [Search]")
_RESULTS = ("[Back to Search] [SEP] Page {page} (Total results: {n}) [SEP] {items}",
            "Search results, page {page} of {pages} ({n} results): {items}",
            "Results page {page}. {items} [SEP] ({n} results in total)")
_ITEM = ("[Back to Search] [SEP] {title} [SEP] Price: ${price:.2f} [SEP] color: {colors} [SEP] size: {sizes} "
         "[SEP] [Buy Now]",
         "Item page: {title}. Price ${price:.2f}. Colors: {colors}. Sizes: {sizes}. [Buy Now]",
         "{title} [SEP] ${price:.2f} [SEP] options - color {colors}; size {sizes} [SEP] Buy Now")
_CLICKED = ("You have clicked {value}.", "Selected: {value}.", "You chose {value}.")


@dataclass(frozen=True)
class ShopConfig(PolicyConfig):
    """Knobs of the WebShop-like generator and of its behaviour policy.

    Attributes:
        n_items: catalogue items per task, 6, 9, 12 or 15 (pages of 3). The first 6 are the target, three
            look-alikes that the results page tells apart (price or attribute) and two of another category;
            every further one is a look-alike that only its item page tells apart (module docstring).
        n_colors / n_sizes: option values per item, in [2, 4].
        n_variants: wordings per observation kind, in [1, 3].
        search_noise: probability that a query's ranking is the noisy one (target lower), in [0, 1).
        horizon: max steps H. history: K, past actions the behaviour policy and the prompt see.
        invalid_prob / expert_bias / prior_scale / obs_scale / repeat_penalty: behaviour policy, as
            :class:`progpo.envs.synthetic.alfworld_like.MDPConfig`.
        success_reward: reward of a perfect purchase (reward units). invalid_penalty: >= 0.
        win_only: pay ``success_reward`` for a perfect purchase and 0 for any other (verl-agent's WebShop),
            instead of the partial score.
        gamma: discount of the returns whose true advantages are computed.
    """

    n_items: int = 6
    n_colors: int = 3
    n_sizes: int = 3
    n_variants: int = 2
    search_noise: float = 0.3
    horizon: int = 15
    history: int = 2
    invalid_prob: float = 0.05
    expert_bias: float = 2.5
    prior_scale: float = 0.5
    obs_scale: float = 0.5
    repeat_penalty: float = 1.0
    success_reward: float = 10.0
    invalid_penalty: float = 0.1
    gamma: float = 0.95
    win_only: bool = False

    def __post_init__(self) -> None:
        if self.n_items not in (6, 9, 12, 15):
            raise ValueError(f"n_items must be 6, 9, 12 or 15 (result pages of three), got {self.n_items}")
        for name in ("n_colors", "n_sizes"):
            if not 2 <= getattr(self, name) <= 4:
                raise ValueError(f"{name} must be in [2, 4], got {getattr(self, name)}")
        if not 1 <= self.n_variants <= 3:
            raise ValueError(f"n_variants must be in [1, 3], got {self.n_variants}")
        if not 0 <= self.search_noise < 1:
            raise ValueError(f"search_noise must be in [0, 1), got {self.search_noise}")
        self.check_common()


@dataclass(frozen=True)
class Item:
    """A catalogue item: title words, price (dollars) and option values."""

    title: str
    category: str
    attribute: str
    price: float
    colors: tuple[str, ...]
    sizes: tuple[str, ...]


class ShopTask(ExpertSoftmaxPolicy):
    """One seeded WebShop-like task (a :class:`progpo.envs.synthetic.mdp.TextMDP` with its behaviour policy).

    Args:
        cfg: generator and policy settings; seed: equal seeds give identical tasks.
    """

    def __init__(self, cfg: ShopConfig, seed: int) -> None:
        self.cfg, self.seed = cfg, int(seed)
        self.horizon, self.gamma, self.history = cfg.horizon, cfg.gamma, cfg.history
        rng = np.random.default_rng([4099, self.seed])
        cats = rng.choice(len(CATEGORIES), size=2, replace=False)
        atts = rng.choice(len(ATTRIBUTES), size=2, replace=False)
        cat, other_cat = CATEGORIES[cats[0]], CATEGORIES[cats[1]]
        att, other_att = ATTRIBUTES[atts[0]], ATTRIBUTES[atts[1]]
        colors = [COLORS[i] for i in rng.choice(len(COLORS), size=cfg.n_colors + 1, replace=False)]
        sizes = [SIZES[i] for i in rng.choice(len(SIZES), size=cfg.n_sizes + 1, replace=False)]
        brands = [BRANDS[i] for i in rng.choice(len(BRANDS), size=6, replace=False)]
        self.color, self.size = colors[0], sizes[0]
        self.budget = float(rng.integers(3, 9) * 10)
        cheap = lambda g=rng: round(self.budget * float(g.uniform(0.4, 0.9)), 2)  # noqa: E731 - under the budget
        dear = lambda: round(self.budget * float(rng.uniform(1.2, 1.8)), 2)  # noqa: E731
        own = tuple(sorted(colors[:cfg.n_colors], key=lambda c: rng.random()))
        no_goal = tuple(colors[1:cfg.n_colors + 1])
        szs = tuple(sorted(sizes[:cfg.n_sizes], key=lambda s: rng.random()))
        no_size = tuple(sizes[1:cfg.n_sizes + 1])
        mk = lambda b, a, c, p, cs, ss=szs: Item(f"{b} {a} {c}", c, a, p, cs, ss)  # noqa: E731
        self.items = [
            mk(brands[0], att, cat, cheap(), own),                                      # 0 target
            mk(brands[1], att, cat, dear(), no_goal, no_size),                          # 1 lacks both goal options
            mk(brands[2], att, cat, dear(), own),                                       # 2 too expensive
            mk(brands[3], other_att, cat, cheap(), own),                                # 3 wrong attribute
            mk(brands[4], att, other_cat, cheap(), own),                                # 4, 5 other category
            mk(brands[5], other_att, other_cat, cheap(), own),
        ]
        self.category, self.attribute = cat, att
        self.pages = cfg.n_items // 3
        xrng = self._add_lookalikes(cfg, att, cat, cheap, own, szs, no_goal, no_size)
        self.goal_text = (f"i need a {att} {cat} in {self.color}, size {self.size}, price lower than "
                          f"{self.budget:.2f} dollars")
        self.queries = (f"{att} {cat} {self.color}", cat, f"{other_cat}")
        n = cfg.search_noise
        # per query: (probability, ranking of the items); page p = items 3(p-1) .. 3p-1
        self.rankings = (
            ((1 - n, (0, 1, 2, 3, 4, 5)), (n, (1, 2, 3, 0, 4, 5))),
            ((1 - n, (1, 0, 3, 2, 4, 5)), (n, (3, 2, 1, 0, 4, 5))),
            ((1 - n, (4, 5, 3, 2, 1, 0)), (n, (4, 5, 0, 1, 2, 3))),
        ) if cfg.n_items == 6 else self._long_rankings(n, xrng)
        self.invalid_actions = ["click[buy now]", "click[next >]"]
        vocab = [f"search[{q}]" for q in self.queries] + [f"click[{it.title}]" for it in self.items[:6]]
        vocab += [f"click[{c}]" for c in colors] + [f"click[{s}]" for s in sizes]
        vocab += ["click[buy now]", "click[next >]", "click[< prev]", "click[back to search]"]
        vocab += [f"click[{it.title}]" for it in self.items[6:]]  # look-alikes last: the original draws stay
        self.prior = {a: float(rng.normal(0, cfg.prior_scale)) for a in vocab}
        self._obs_noise: dict[str, dict[str, float]] = {}
        self._logit_cache: dict[tuple, list[float]] = {}
        self._out_cache: dict[tuple, list[Outcome]] = {}
        self._adm_cache: dict[tuple, list[str]] = {}

    def _add_lookalikes(self, cfg: ShopConfig, att: str, cat: str, cheap, own: tuple[str, ...],
                        szs: tuple[str, ...], no_goal: tuple[str, ...],
                        no_size: tuple[str, ...]) -> np.random.Generator | None:
        """Append the ``n_items - 6`` look-alikes of a longer search (even: lack the goal color; odd: the goal
        size) and return their random stream (None with 6 items). Their brands and prices (``cheap(stream)``,
        the target's price rule) come from that stream of their own, so 6 items keep every original draw."""
        if cfg.n_items == 6:
            return None
        xrng = np.random.default_rng([4099, self.seed, 1])
        brands = [EXTRA_BRANDS[i] for i in xrng.choice(len(EXTRA_BRANDS), size=cfg.n_items - 6, replace=False)]
        for k, brand in enumerate(brands):
            colors, sizes = (no_goal, szs) if k % 2 == 0 else (own, no_size)
            self.items.append(Item(f"{brand} {att} {cat}", cat, att, cheap(xrng), colors, sizes))
        return xrng

    def _long_rankings(self, n: float, xrng: np.random.Generator) -> tuple:
        """Rankings of a longer search (``n_items`` > 6): per query (clean, noisy) with probabilities
        ``(1 - n, n)``, as the module docstring lays them out (the target's slots drawn from ``xrng``)."""
        extra = list(range(6, len(self.items)))
        rest = [1, 2, 3]
        last = len(self.items) - 3

        def place(order: list[int], slot: int) -> tuple[int, ...]:
            return tuple(order[:slot] + [0] + order[slot:])

        precise = extra + rest + [4, 5]
        vague = extra[:2] + [1, 3] + extra[2:] + [2, 4, 5]
        off = [4, 5] + rest + extra
        slot = int(xrng.integers(0, 3))
        last_slot = last + int(xrng.integers(0, 3))
        return (
            ((1 - n, place(precise, slot)), (n, place(precise, last_slot))),
            ((1 - n, place(vague, 3 + slot)), (n, place(vague, last_slot))),
            ((1 - n, place(off, last_slot)), (n, place(off, last_slot))),
        )

    # ------------------------------------------------------------ environment
    def initial(self) -> list[tuple[float, tuple, str]]:
        """Initial ``(prob, state, observation)`` triples: the search page under each wording."""
        texts = self._texts(_SEARCH, goal=self.goal_text)
        return [(1.0 / len(texts), ("search",), t) for t in texts]

    def admissible(self, state: tuple) -> list[str]:
        """Admissible action texts (the clickables WebShop would list), in a fixed order."""
        got = self._adm_cache.get(state)
        if got is None:
            got = self._adm_cache[state] = self._admissible(state)
        return got

    def _admissible(self, state: tuple) -> list[str]:
        if state[0] == "search":
            return [f"search[{q}]" for q in self.queries]
        if state[0] == "results":
            _, q, r, page = state
            acts = [f"click[{self.items[i].title}]" for i in self._page(q, r, page)]
            turns = (["click[next >]"] if page < self.pages else []) + (["click[< prev]"] if page > 1 else [])
            return acts + turns + ["click[back to search]"]
        it = self.items[state[1]]
        return ([f"click[{c}]" for c in it.colors] + [f"click[{s}]" for s in it.sizes]
                + ["click[buy now]", "click[back to search]"])

    def state_extra(self, state: tuple) -> str:
        """State extra (``Task.state_extra``; the ALFWorld inventory analogue): the options selected on the current
        item page."""
        if state[0] != "item":
            return "No options selected."
        it, c, s = self.items[state[1]], state[2], state[3]
        return (f"Selected options: color {it.colors[c] if c >= 0 else 'none'}, "
                f"size {it.sizes[s] if s >= 0 else 'none'}.")

    def score(self, state: tuple) -> float:
        """WebShop-style reward in [0, 1] of buying in item state ``state``."""
        it, c, s = self.items[state[1]], state[2], state[3]
        r_type = 1.0 if it.category == self.category else 0.1
        hits = [it.attribute == self.attribute, c >= 0 and it.colors[c] == self.color,
                s >= 0 and it.sizes[s] == self.size, it.price <= self.budget]
        return r_type * sum(hits) / 4.0

    def decision_kind(self, state: tuple, action: str) -> str:
        """The kind of decision ``action`` makes in ``state`` (for probes of a policy, per kind): ``search``;
        on a results page ``results: item`` (a product title), ``results: page`` (next / prev) or
        ``results: back``; on an item page ``item: option`` (a color or size), ``item: buy`` or ``item: back``."""
        if state[0] == "search":
            return "search"
        if action == "click[back to search]":
            return f"{state[0]}: back"
        if state[0] == "results":
            return "results: page" if action in ("click[next >]", "click[< prev]") else "results: item"
        return "item: buy" if action == "click[buy now]" else "item: option"

    def expert_action(self, state: tuple) -> str:
        """The next action of an expert that knows which item is the target."""
        if state[0] == "search":
            return f"search[{self.queries[0]}]"
        if state[0] == "results":
            _, q, r, page = state
            if 0 in self._page(q, r, page):
                return f"click[{self.items[0].title}]"
            if self.pages > 2 and page > self.rankings[q][r][1].index(0) // 3 + 1:
                return "click[< prev]"  # past the target's page (6 items keep the original expert: back to search)
            return "click[next >]" if page < self.pages else "click[back to search]"
        _, i, c, s = state
        it = self.items[i]
        if i != 0:
            return "click[back to search]"
        if c < 0 or it.colors[c] != self.color:
            return f"click[{self.color}]"
        if s < 0 or it.sizes[s] != self.size:
            return f"click[{self.size}]"
        return "click[buy now]"

    def outcomes(self, state: tuple, action: str) -> list[Outcome]:
        """Transition and observation distribution of ``action`` in ``state`` (cached)."""
        key = (state, action)
        got = self._out_cache.get(key)
        if got is None:
            got = self._out_cache[key] = self._outcomes(state, action)
        return got

    def _outcomes(self, state: tuple, action: str) -> list[Outcome]:
        if action not in self.admissible(state):
            return [Outcome(1.0, state, NOTHING, -self.cfg.invalid_penalty, False, True)]
        if action == "click[back to search]":
            return self._spread(1.0, ("search",), self._texts(_SEARCH, goal=self.goal_text))
        if state[0] == "search":
            q = [f"search[{x}]" for x in self.queries].index(action)
            return [o for r, (p, _) in enumerate(self.rankings[q]) if p > 0
                    for o in self._spread(p, ("results", q, r, 1), self._results(q, r, 1))]
        if state[0] == "results":
            _, q, r, page = state
            if action in ("click[next >]", "click[< prev]"):
                new = page + 1 if action == "click[next >]" else page - 1
                return self._spread(1.0, ("results", q, r, new), self._results(q, r, new))
            i = [f"click[{it.title}]" for it in self.items].index(action)
            return self._spread(1.0, ("item", i, -1, -1), self._page_texts(i))
        _, i, c, s = state
        it = self.items[i]
        if action == "click[buy now]":
            score = self.score(state)
            reward = self.cfg.success_reward * (float(score == 1.0) if self.cfg.win_only else score)
            return [Outcome(1.0, None, f"Thank you for shopping with us! Your score: {reward / 10:.2f}",
                            reward, True, False)]
        value = action[6:-1]
        new = ("item", i, it.colors.index(value), s) if value in it.colors else ("item", i, c, it.sizes.index(value))
        page = self._page_texts(i)
        return self._spread(1.0, new, [f"{clk.format(value=value)} {p}"
                                       for clk, p in zip(self._variants(_CLICKED), page)])

    def step(self, state: tuple, action: str, rng: np.random.Generator) -> Outcome:
        """Sample one transition."""
        outs = self.outcomes(state, action)
        return outs[int(rng.choice(len(outs), p=np.array([o.prob for o in outs])))]

    # ------------------------------------------------------------ helpers
    def _page(self, q: int, r: int, page: int) -> tuple[int, ...]:
        ranking = self.rankings[q][r][1]
        return ranking[3 * (page - 1): 3 * page]

    def _variants(self, templates: tuple[str, ...]) -> tuple[str, ...]:
        return templates[: self.cfg.n_variants]

    def _texts(self, templates: tuple[str, ...], **kw) -> list[str]:
        return [v.format(**kw) for v in self._variants(templates)]

    def _results(self, q: int, r: int, page: int) -> list[str]:
        items = " [SEP] ".join(f"[{self.items[i].title}] ${self.items[i].price:.2f}" for i in self._page(q, r, page))
        return self._texts(_RESULTS, page=page, pages=self.pages, n=len(self.items), items=items)

    def _page_texts(self, i: int) -> list[str]:
        it = self.items[i]
        return self._texts(_ITEM, title=it.title, price=it.price, colors=" ".join(f"[{c}]" for c in it.colors),
                           sizes=" ".join(f"[{s}]" for s in it.sizes))

    def _spread(self, prob: float, state: tuple, texts: list[str]) -> list[Outcome]:
        return [Outcome(prob / len(texts), state, t, 0.0, False, False) for t in texts]


def make_shop_tasks(cfg: ShopConfig, n_tasks: int, seed: int) -> list[ShopTask]:
    """``n_tasks`` tasks with seeds derived from ``seed`` (task ``j`` has seed ``seed * 100003 + j``)."""
    if n_tasks < 1:
        raise ValueError(f"n_tasks must be >= 1, got {n_tasks}")
    return [ShopTask(cfg, seed * 100003 + j) for j in range(n_tasks)]
