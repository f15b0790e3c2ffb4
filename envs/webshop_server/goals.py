"""WebShop goals (instructions) and their fixed train/eval/test split.

Source: Yao et al. 2022 (princeton-nlp/WebShop ``web_agent_site/engine/goal.py``:
``get_synthetic_goals`` / ``get_human_goals``; ``web_agent_site/envs/web_agent_text_env.py``:
``random.seed(233); random.shuffle(goals)``). Re-implemented here:

* synthetic goals: one goal per combination of the product's option values (options sorted by
  name), instruction ``"{instruction}{ with name: value, and ...}{, and price lower than X dollars}"``;
* price bound: of the round prices ``10, 20, ..., 990`` above the product's price keep the first
  four; if at least two remain, draw two with ``rng.sample`` and use the larger one; else no bound
  (1,000,000);
* weight: mean over the goal's attributes of ``1 / count(attribute among all goals)``;
* the goal list is shuffled with ``Random(233)``, identical in every process.

Split (by index into the shuffled list): ``standard`` = test ``[0, 500)``, eval ``[500, 1500)``,
train ``[1500, n)`` (WebShop's convention); ``proportional`` = test first 10 %, eval next 10 %,
train the remaining 80 % (for small catalogs such as the 87-product subset, where the standard
split would leave no training goals). ``auto`` uses ``standard`` when ``n >= 2000`` goals.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
SHUFFLE_SEED = 233
SPLITS = ("train", "eval", "test")
STANDARD_MIN_GOALS = 2000


def _price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) >= 2:
        _, upper = sorted(rng.sample(candidates, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return 1000000, ""


def synthetic_goals(products: Iterable[dict[str, Any]], prices: Mapping[str, float], rng: random.Random) -> list[dict]:
    """Synthetic goals for every product with an instruction (see module docstring).

    Raises:
        ValueError: a product with an instruction but no instruction attributes (original asserts).
    """
    goals: list[dict] = []
    counts: dict[str, int] = defaultdict(int)
    for product in products:
        if product.get("instruction_text") is None:
            continue
        attributes = product["instruction_attributes"]
        if not attributes:
            raise ValueError(f"product {product['asin']} has an instruction but no instruction_attributes")
        upper, price_text = _price_bound(prices[product["asin"]], rng)
        names = sorted(product["options"])
        for combo in itertools.product(*(product["options"][n] for n in names)):
            goal_options = dict(zip(names, combo))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append({
                "asin": product["asin"],
                "category": product["category"],
                "query": product["query"],
                "name": product["Title"],
                "product_category": product["product_category"],
                "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                "attributes": attributes,
                "price_upper": upper,
                "goal_options": goal_options,
            })
            for att in attributes:
                counts[att] += 1
    for goal in goals:
        goal["weight"] = sum(1.0 / counts[a] for a in goal["attributes"]) / len(goal["attributes"])
    return goals


def human_goals(products: Iterable[dict[str, Any]], prices: Mapping[str, float], rng: random.Random) -> list[dict]:
    """Goals from ``items_human_ins.json`` (products carry ``instructions``); weight 1 each.

    Instructions with no attributes are skipped, as in the original.
    """
    goals: list[dict] = []
    for product in products:
        for ins in product.get("instructions", []):
            attributes = ins["instruction_attributes"]
            if not attributes:
                continue
            upper, price_text = _price_bound(prices[product["asin"]], rng)
            goals.append({
                "asin": product["asin"],
                "category": product["category"],
                "query": product["query"],
                "name": product["name"],
                "product_category": product["product_category"],
                "instruction_text": ins["instruction"].strip(".") + price_text,
                "attributes": attributes,
                "price_upper": upper,
                "goal_options": ins["instruction_options"],
                "weight": 1,
            })
    return goals


@dataclass(frozen=True)
class GoalSplits:
    """Index ranges ``[start, stop)`` of each split into the shuffled goal list."""

    mode: str
    ranges: dict[str, tuple[int, int]]

    def size(self, split: str) -> int:
        """Number of goals in ``split``; ValueError names the known splits."""
        lo, hi = self.range(split)
        return hi - lo

    def range(self, split: str) -> tuple[int, int]:
        """``(start, stop)`` of ``split``; ValueError names the known splits."""
        if split not in self.ranges:
            raise ValueError(f"unknown split {split!r}; choose one of {list(SPLITS)}")
        return self.ranges[split]

    def goal_index(self, split: str, index: int) -> int:
        """Global goal index of task ``index`` of ``split``; ValueError when out of range."""
        lo, hi = self.range(split)
        if not 0 <= index < hi - lo:
            raise ValueError(f"index {index} out of range for split {split!r} with {hi - lo} goals")
        return lo + index


def make_splits(n_goals: int, mode: str = "auto") -> GoalSplits:
    """Split ``n_goals`` shuffled goals (see module docstring).

    Raises:
        ValueError: unknown ``mode``, or ``standard`` asked for with too few goals for a train split.
    """
    if mode not in ("auto", "standard", "proportional"):
        raise ValueError(f"split mode must be auto, standard or proportional, got {mode!r}")
    if mode == "auto":
        mode = "standard" if n_goals >= STANDARD_MIN_GOALS else "proportional"
    if mode == "standard":
        if n_goals <= 1500:
            raise ValueError(f"standard split needs more than 1500 goals, have {n_goals}")
        ranges = {"test": (0, 500), "eval": (500, 1500), "train": (1500, n_goals)}
    else:
        n_test = n_goals // 10
        ranges = {"test": (0, n_test), "eval": (n_test, 2 * n_test), "train": (2 * n_test, n_goals)}
    return GoalSplits(mode, ranges)


def make_goals(goal_products: Iterable[dict[str, Any]], prices: Mapping[str, float], rng: random.Random, *,
               human: bool, goal_source: str = "auto", human_file: Path | None = None,
               fallback: Callable[[], Iterable[dict[str, Any]]] | None = None) -> tuple[list[dict], bool]:
    """Goals from the products that can carry one, shuffled with ``Random(233)``.

    Args:
        goal_products: products in catalog order (only those with ``instructions`` or an
            ``instruction_text`` matter; others are skipped without consuming ``rng``).
        prices, rng: the catalog's prices and the RNG after the price draws.
        human: human instructions were attached to the products.
        goal_source: ``auto`` falls back to synthetic goals, with a warning, when the human file
            gives no usable goal (e.g. a placeholder ``{}``); ``human`` then raises.
        human_file: the human instructions file (for messages).
        fallback: gives the products for synthetic goals when falling back (default: ``goal_products``).

    Returns:
        (goals, human_used). The count of usable goals is logged: human goals whose product is not
        in the catalog never reach here (dropped, as in the original) and instructions without
        attributes are skipped.

    Raises:
        ValueError: no goal at all, or ``goal_source="human"`` with no usable human goal.
    """
    products = list(goal_products) if not isinstance(goal_products, list) else goal_products
    if human:
        goals = human_goals(products, prices, rng)
        n_written = sum(len(p.get("instructions", [])) for p in products)
        log.info("human goals: %d usable from %s (%d instructions on catalog products, %d of them without "
                 "attributes skipped; instructions on products not in the catalog dropped)",
                 len(goals), human_file, n_written, n_written - len(goals))
        if not goals:
            if goal_source == "human":
                raise ValueError(f"{human_file}: 0 usable human goals ({n_written} instructions on catalog "
                                 "products have attributes); use --goal-source auto or synthetic")
            log.warning("%s gives 0 usable human goals; falling back to synthetic goals (--goal-source auto)",
                        human_file)
            human = False
            products = list(fallback()) if fallback is not None else products
    if not human:
        goals = synthetic_goals(products, prices, rng)
        log.info("synthetic goals: %d", len(goals))
    if not goals:
        raise ValueError("no goals could be made from the catalog (no product has an instruction)")
    random.Random(SHUFFLE_SEED).shuffle(goals)
    return goals, human


def build_goals(catalog: Any, rng: random.Random, split_mode: str = "auto",
                goal_source: str = "auto") -> tuple[list[dict], GoalSplits]:
    """Goals for an in-memory ``catalog`` (see ``make_goals``) and their splits."""
    goals, human = make_goals(catalog.products, catalog.prices, rng, human=catalog.human_goals,
                              goal_source=goal_source, human_file=catalog.human_file)
    catalog.human_goals = human
    return goals, make_splits(len(goals), split_mode)
