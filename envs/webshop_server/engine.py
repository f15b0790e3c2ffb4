"""One shopping session: page state, the original's action semantics, rendering.

Action semantics follow the original text environment (princeton-nlp/WebShop,
``web_agent_site/envs/web_agent_text_env.py``: ``WebAgentTextEnv.step`` and ``SimServer.receive``):

* ``search[q]`` (q lower-cased, split on spaces) runs a search from any page and shows results page 1;
* ``click[x]`` must name one of the page's clickables (not ``search``): x lower-cased equal to a
  clickable (the original's exact rule) or, failing that, equal to one after
  :func:`normalize_action` on both sides (:func:`resolve_clickable`, a documented
  extension); ``buy now`` ends the session with the reward; ``back to search`` returns to the
  search page (forgetting keywords, product, options and visited products); ``next >`` / ``< prev``
  page through results; ``< prev`` on an item page returns to the results, on a sub page to the
  item page; ``description`` / ``features`` / ``reviews`` / ``attributes`` open a sub page; a
  product ASIN opens its item page; an option value selects it;
* anything else changes nothing (``valid = False`` with a message naming why).

Deviation (documented): after ``buy now`` the session is finished and every further action is a
no-op; the original would still run a search.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2

from envs.webshop_server import observation as obs
from envs.webshop_server.reward import get_reward
from envs.webshop_server.search import SEARCH_RETURN_N

PRODUCT_WINDOW = 10
SIM_BASE_URL = "http://127.0.0.1:3000"  # the original text env's fixed base URL (url observation)
END_BUTTON = "buy now"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BACK_TO_SEARCH = "back to search"
SUB_PAGES = {"description": "Description", "features": "Features", "reviews": "Reviews", "attributes": "Attributes"}
_ACTION = re.compile(r"(.+)\[(.+)\]", re.DOTALL)

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


def parse_action(action: str) -> tuple[str, str | None]:
    """``"click[Buy Now]"`` -> ``("click", "Buy Now")``; no brackets -> ``(action, None)`` (original regex)."""
    m = _ACTION.match(action)
    if m is None:
        return action, None
    return m.group(1), m.group(2)


def normalize_action(text: str) -> str:
    """Lower-case, strip, and collapse every run of (Unicode) whitespace to one space. Idempotent.

    The agent's parser applies the same rule to its actions (``progpo.envs.base.normalize_action``;
    the server imports no training code, and a test keeps the two equal).
    """
    return " ".join(str(text).lower().split())


def resolve_clickable(arg: str, clickables: list[str]) -> str | None:
    """The clickable a ``click[arg]`` names, or None.

    The original compares the lower-cased ``arg`` with the clickables exactly, so a label with
    inner whitespace runs (``"black  |  white"`` from ``"Black / White"``), tabs or non-breaking
    spaces could never be clicked by an agent whose parser normalises its actions. Rule: an exact
    match wins (the original's behaviour, unchanged where it accepts); otherwise the clickables
    whose ``normalize_action`` form equals ``normalize_action(arg)`` (the function the agent's
    parser applies to the action): the one already in normal form if there is one (so every
    normalised spelling of an action lands on the same label), else the first in page order.

    Args:
        arg: the text inside ``click[...]``.
        clickables: the page's clickables (``available_actions()["clickables"]``), page order.
    """
    if arg in clickables:
        return arg
    key = normalize_action(arg)
    matches = [c for c in clickables if normalize_action(c) == key]
    return key if key in matches else next(iter(matches), None)


def q(value: Any) -> str:
    """Quote one URL path part (``/`` escaped too) from its Python ``str`` form, like Flask's url_for."""
    return quote(str(value), safe=":")


@dataclass
class PageState:
    """Where a session is: page kind and its parameters (the original's URL parts)."""

    kind: str = "index"  # index | search_results | item_page | item_sub_page | done
    keywords: list[str] | None = None
    page: int | None = None
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub_page: str | None = None


class Urls:
    """Browser URLs (the original's scheme) for one session and page state."""

    def __init__(self, sid: str, st: PageState) -> None:
        self.sid, self.st = sid, st
        self.index = f"/{sid}"

    def results_for(self, page: int) -> str:
        return f"/search_results/{self.sid}/{q(self.st.keywords)}/{page}"

    @property
    def results(self) -> str:
        return self.results_for(self.st.page or 1)

    @property
    def prev_page(self) -> str:
        return self.results_for((self.st.page or 1) - 1)

    @property
    def next_page(self) -> str:
        return self.results_for((self.st.page or 1) + 1)

    def item(self, asin: str, options: dict | None = None) -> str:
        return f"/item_page/{self.sid}/{asin}/{q(self.st.keywords)}/{self.st.page}/{q(options or {})}"

    @property
    def item_back(self) -> str:
        return self.item(self.st.asin, self.st.options)

    def option(self, name: str, value: str) -> str:
        return self.item(self.st.asin, {**self.st.options, name: value})

    def sub_page(self, name: str) -> str:
        return f"/item_sub_page/{self.sid}/{self.st.asin}/{q(self.st.keywords)}/{self.st.page}/{name}/{q(self.st.options)}"

    @property
    def done(self) -> str:
        return f"/done/{self.sid}/{self.st.asin}/{q(self.st.options)}"

    @property
    def current(self) -> str:
        st = self.st
        if st.kind == "search_results":
            return self.results
        if st.kind == "item_page":
            return self.item_back
        if st.kind == "item_sub_page":
            return self.sub_page(st.sub_page)
        if st.kind == "done":
            return self.done
        return self.index

    def sim_url(self) -> str:
        """The URL path the original simulator keeps, without its base URL (``text_rich`` marks
        clicked options by it; the ``url`` observation is ``SIM_BASE_URL + sim_url()``).

        Forms (``SimServer`` of ``web_agent_text_env.py``): ``/<sid>``,
        ``/search_results/<sid>/<kw1+kw2>/<page>``, ``/item_page/<sid>/<ASIN>/<kw>/<page>/<options as
        JSON>``, ``/item_sub_page/<sid>/<ASIN>/<kw>/<page>/<Tab>/<options as Python dict>``,
        ``/done/<sid>/<ASIN>/<options as Python dict>``; nothing is URL-quoted.
        """
        st = self.st
        kw = "+".join(st.keywords or [])
        if st.kind == "search_results":
            return f"/search_results/{self.sid}/{kw}/{st.page}"
        if st.kind == "item_page":
            return f"/item_page/{self.sid}/{st.asin}/{kw}/{st.page}/{json.dumps(st.options)}"
        if st.kind == "item_sub_page":
            return f"/item_sub_page/{self.sid}/{st.asin}/{kw}/{st.page}/{st.sub_page}/{st.options}"
        if st.kind == "done":
            return f"/done/{self.sid}/{st.asin}/{st.options}"
        return f"/{self.sid}"


class Session:
    """One agent's or person's shopping session (no state shared with other sessions).

    Args:
        sid: the unguessable session id.
        goal: the goal dict; ``goal_index`` its index in the shuffled goal list.
        shop: the ``Shop`` (catalog, search index, settings).
    """

    def __init__(self, sid: str, goal: dict[str, Any], goal_index: int, shop: Any) -> None:
        self.sid, self.goal, self.goal_index, self.shop = sid, goal, goal_index, shop
        self.lock = threading.Lock()
        self.state = PageState()
        self.visited: set[str] = set()
        self.done = False
        self.reward = 0.0
        self.reward_info: dict[str, Any] | None = None
        self.purchase: dict[str, Any] | None = None
        self.steps = 0
        self.last_used = time.monotonic()
        self._search_cache: tuple[tuple[str, ...], list[str]] | None = None
        self._render()

    # ----- rendering -------------------------------------------------------------------------
    def _results(self, keywords: list[str]) -> list[str]:
        key = tuple(keywords)
        if self._search_cache is None or self._search_cache[0] != key:
            self._search_cache = (key, self.shop.search(" ".join(keywords))[:SEARCH_RETURN_N])
        return self._search_cache[1]

    def render_html(self) -> str:
        """HTML of the current page."""
        st, urls = self.state, Urls(self.sid, self.state)
        common = {"instruction_text": self.goal["instruction_text"], "urls": urls,
                  "static_url": "/static/style.css"}
        if st.kind == "index":
            return _TEMPLATES.get_template("search_page.html").render(
                max_query_chars=self.shop.max_query_chars, **common)
        if st.kind == "search_results":
            hits = self._results(st.keywords or [])
            lo = (st.page - 1) * PRODUCT_WINDOW
            products = [self.shop.catalog.by_asin[a] for a in hits[lo:lo + PRODUCT_WINDOW]]
            return _TEMPLATES.get_template("results_page.html").render(
                products=products, page=st.page, total=len(hits), **common)
        product = self.shop.catalog.by_asin[st.asin]
        if st.kind == "item_page":
            image = product["MainImage"]
            for value in st.options.values():
                image = product["option_to_image"].get(value) or image
            return _TEMPLATES.get_template("item_page.html").render(
                product_info=product, options=st.options, image=image,
                show_attrs=self.shop.show_attrs, **common)
        if st.kind == "item_sub_page":
            return _TEMPLATES.get_template("sub_page.html").render(
                product_info=product, sub_page=st.sub_page, **common)
        p = self.purchase or {}
        return _TEMPLATES.get_template("done_page.html").render(
            mturk_code=hashlib.sha1(self.sid.encode()).hexdigest()[:10].upper(),
            asin=st.asin, options=st.options, purchased_attrs=product["Attributes"],
            category=product["category"], query=product["query"],
            product_category=product["product_category"], goal=self.goal,
            reward=self.reward, reward_info=p.get("reward_info"), **common)

    def _model(self) -> obs.PageModel | None:
        """The current page as a ``PageModel`` (None for the done page, which is parsed from HTML)."""
        st, product = self.state, None
        instruction = self.goal["instruction_text"]
        if st.kind == "index":
            m = obs.PageModel(has_search_bar=True)
            m.add("WebShop")
            m.add("Instruction: ")
            m.add(instruction)
            m.button("Search")
            return m
        if st.kind == "done":
            return None
        m = obs.PageModel()
        m.add("Instruction:")
        m.add(instruction)
        m.button("Back to Search")
        if st.kind == "search_results":
            hits = self._results(st.keywords or [])
            lo = (st.page - 1) * PRODUCT_WINDOW
            m.add(f"Page {st.page} (Total results: {len(hits)})")
            if st.page > 1:
                m.button("< Prev")
            m.button("Next >")  # on every page, also past the last result (as the original)
            for asin in hits[lo:lo + PRODUCT_WINDOW]:
                item = self.shop.catalog.by_asin[asin]
                m.add(item["asin"], "product")
                m.links.append(item["asin"])
                m.add(item["Title"])
                m.add(item["Price"])
            return m
        product = self.shop.catalog.by_asin[st.asin]
        m.button("< Prev")
        if st.kind == "item_page":
            for name, values in product["options"].items():
                m.add(name)
                for value in values:
                    m.add(value, "label")
                    m.radios.append(str(value))
            m.add(product["Title"])
            m.add(f"Price: {product['Price']}")
            m.add(f"Rating: {product['Rating']}")
            for tab in ("Description", "Features", "Reviews") + (("Attributes",) if self.shop.show_attrs else ()):
                m.button(tab)
            m.button("Buy Now")
        elif st.sub_page == "Description":  # sub pages: no "No ..." fallbacks, as the original
            m.add(product["Description"])
        elif st.sub_page == "Features":
            for bullet in product["BulletPoints"]:
                m.add(f" {bullet}")
        elif st.sub_page == "Reviews":
            for review in product["Reviews"]:
                m.add(f'"{review.get("title", "")}"')
                m.add(review.get("score", ""))
                m.add(review.get("body", ""))
        else:
            for attribute in product["Attributes"]:
                m.add(f" {attribute}")
            for key in ("category", "query", "product_category"):
                m.add(product[key])
        return m

    def _render(self) -> None:
        self._html: str | None = None
        self._soup = None
        self.model = self._model()
        if self.model is None:  # done page: parse the rendered HTML (once per episode)
            self._soup = obs.parse(self.html)
            self.actions = obs.available_actions(self._soup)
        else:
            self.actions = self.model.actions()
        self._text: str | None = None

    @property
    def html(self) -> str:
        """HTML of the current page (rendered on first use)."""
        if self._html is None:
            self._html = self.render_html()
        return self._html

    @property
    def url(self) -> str:
        """Browser URL of the current page."""
        return Urls(self.sid, self.state).current

    def observation(self, mode: str = "text") -> str:
        """The current page as ``text``, ``text_rich``, ``html`` or ``url``; ValueError otherwise.

        ``url`` is the original text env's URL string (``SIM_BASE_URL`` + :meth:`Urls.sim_url`);
        the page's address on this server is :attr:`url` (the view's ``url`` field).
        """
        if mode == "text":
            if self._text is None:
                self._text = obs.html_to_text(self._soup) if self.model is None else self.model.text()
            return self._text
        if mode == "text_rich":
            url = Urls(self.sid, self.state).sim_url()
            if self.model is None:
                return obs.html_to_text_rich(self._soup, url, self.visited)
            return self.model.text_rich(url, self.visited)
        if mode == "html":
            return self.html
        if mode == "url":  # the original text env's url observation (not this server's browser URL)
            return SIM_BASE_URL + Urls(self.sid, self.state).sim_url()
        raise ValueError(f"observation mode must be text, text_rich, html or url, got {mode!r}")

    # ----- actions -----------------------------------------------------------------------------
    def set_state(self, state: PageState) -> None:
        """Jump to a page (browser navigation by URL); validates ASIN, options, page number.

        Raises:
            LookupError: unknown ASIN; ValueError: unknown option or bad page number.
        """
        if state.asin is not None:
            product = self.shop.catalog.by_asin.get(state.asin)
            if product is None:
                raise LookupError(f"unknown ASIN {state.asin!r}")
            for name, value in state.options.items():
                if value not in product["options"].get(name, ()):
                    raise ValueError(f"product {state.asin} has no option {name}={value!r}")
        if state.kind == "search_results" and (state.page is None or state.page < 1):
            raise ValueError(f"page must be >= 1, got {state.page}")
        if state.kind == "item_page" and state.asin is not None:
            self.visited.add(state.asin)
        self.state = state
        self._render()

    def buy(self) -> None:
        """Buy the current product with the current options; computes and stores the reward."""
        st = self.state
        product = self.shop.catalog.by_asin[st.asin]
        price = self.shop.catalog.prices[st.asin]
        self.reward, info = get_reward(product, self.goal, price, dict(st.options))
        self.reward_info = info
        self.purchase = {"asin": st.asin, "options": dict(st.options), "price": price, "reward_info": info}
        self.done = True
        self.state = PageState("done", st.keywords, st.page, st.asin, dict(st.options))
        self._render()

    def step(self, action: str) -> dict[str, Any]:
        """Apply one agent action; returns ``{"valid": bool, "message": str, "done": bool, "reward": float}``."""
        self.steps += 1
        if self.done:
            return self._result(False, "the session is finished (the product was bought)")
        name, arg = parse_action(action.strip())
        if arg is not None:
            arg = arg.lower()
        if name == "search" and arg:
            if len(arg) > self.shop.max_query_chars:
                return self._result(False, f"search query longer than {self.shop.max_query_chars} characters")
            self.state = PageState("search_results", arg.split(" "), 1)
            self._render()
            return self._result(True, "")
        if name != "click" or arg is None:
            return self._result(False, "actions are search[query] or click[label]")
        label = resolve_clickable(arg, self.actions["clickables"])
        if label is None or label == "search":
            return self._result(False, f"{arg!r} is not clickable on this page")
        self._click(label)
        return self._result(True, "")

    def _click(self, arg: str) -> None:
        st = self.state
        if arg == END_BUTTON:
            self.buy()
        elif arg == BACK_TO_SEARCH:
            self.visited = set()
            self.state = PageState()
        elif arg == NEXT_PAGE and st.kind == "search_results":
            self.state = PageState("search_results", st.keywords, st.page + 1)
        elif arg == PREV_PAGE and st.kind == "search_results":
            self.state = PageState("search_results", st.keywords, st.page - 1)
        elif arg == PREV_PAGE and st.kind == "item_sub_page":
            self.state = PageState("item_page", st.keywords, st.page, st.asin, st.options)
        elif arg == PREV_PAGE and st.kind == "item_page":
            self.state = PageState("search_results", st.keywords, st.page)
        elif arg in SUB_PAGES:
            self.state = PageState("item_sub_page", st.keywords, st.page, st.asin, st.options, SUB_PAGES[arg])
        elif st.kind == "search_results":  # a product link
            asin = arg.upper()
            self.visited.add(asin)
            self.state = PageState("item_page", st.keywords, st.page, asin, {})
        else:  # an option value on the item page
            option_name = self._option_name(arg)
            self.state = PageState("item_page", st.keywords, st.page, st.asin, {**st.options, option_name: arg})
        if not self.done:
            self._render()

    def _option_name(self, value: str) -> str:
        # the original maps a value to the LAST radio input carrying it (dict overwrite)
        product = self.shop.catalog.by_asin[self.state.asin]
        names = [name for name, values in product["options"].items() if value in values]
        if not names:
            raise LookupError(f"no option with value {value!r} on this page")
        return names[-1].lower()

    def _result(self, valid: bool, message: str) -> dict[str, Any]:
        return {"valid": valid, "message": message, "done": self.done,
                "reward": self.reward if self.done else 0.0}
