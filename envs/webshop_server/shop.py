"""The shop: catalog + search index + goals + session store (everything one server process holds)."""

from __future__ import annotations

import functools
import logging
import random
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.webshop_server.cache import load_or_build
from envs.webshop_server.catalog import Catalog
from envs.webshop_server.engine import Session
from envs.webshop_server.goals import SPLITS, build_goals, make_splits
from envs.webshop_server.reward import nlp_ready, preload_nlp
from envs.webshop_server.search import SearchIndex

log = logging.getLogger(__name__)
SEARCH_CACHE = 4096


@dataclass(frozen=True)
class ShopConfig:
    """Server settings.

    Attributes:
        data_dir: WebShop data folder (None: :func:`~envs.webshop_server.paths.default_data_dir`).
        products_file: products file name inside ``data_dir`` (None: default search order).
        num_products: keep only the first N products (None: all).
        goal_source: ``auto`` / ``human`` / ``synthetic``.
        split_mode: ``auto`` / ``standard`` / ``proportional`` (see ``goals``).
        price_seed: seed of the price draws (0 reproduces the reference reward cases).
        session_ttl_s: seconds of inactivity after which a session is dropped.
        max_sessions: sessions held at most; creating more returns HTTP 503.
        max_query_chars: longest accepted search query.
        show_attrs: show the Attributes tab on item pages (original ``--attrs``).
        use_cache: cache large catalogs and their index on disk (see ``envs.webshop_server.cache``).
        cache_dir: cache folder (None: ``~/.cache/progpo/webshop``).
        cache_min_mb: products files smaller than this many MiB are never cached.
        preload_nlp: load spaCy (title nouns of the reward) in a background thread at start, so
            the first purchase does not wait for it.
        search_cache: distinct queries whose results are kept (0: none).
    """

    data_dir: str | None = None
    products_file: str | None = None
    num_products: int | None = None
    goal_source: str = "auto"
    split_mode: str = "auto"
    price_seed: int = 0
    session_ttl_s: float = 3600.0
    max_sessions: int = 10_000
    max_query_chars: int = 500
    show_attrs: bool = False
    use_cache: bool = True
    cache_dir: str | None = None
    cache_min_mb: float = 32.0
    preload_nlp: bool = True
    search_cache: int = SEARCH_CACHE

    def __post_init__(self) -> None:
        if not self.session_ttl_s > 0:  # NaN too: it compares false with every idle time
            raise ValueError(f"session_ttl_s must be > 0, got {self.session_ttl_s}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.search_cache < 0:
            raise ValueError(f"search_cache must be >= 0, got {self.search_cache}")
        if not 0 <= self.cache_min_mb < float("inf"):  # NaN too: no file size compares >= NaN
            raise ValueError(f"cache_min_mb must be a finite number >= 0, got {self.cache_min_mb}")
        if self.max_query_chars < 1:
            raise ValueError(f"max_query_chars must be >= 1, got {self.max_query_chars}")


class ShopFull(RuntimeError):
    """No room for another session (``max_sessions`` live sessions)."""


class Shop:
    """Catalog, search, goals and sessions of one server process.

    Args:
        config: the settings; ``catalog`` may be passed pre-loaded (benchmarks), with ``rng`` the
            RNG returned by ``load_catalog``.
    """

    def __init__(self, config: ShopConfig, catalog: Catalog | None = None, rng: random.Random | None = None) -> None:
        t0 = time.perf_counter()
        self.config = config
        if catalog is None:
            catalog, self.goals, self.index = load_or_build(config)
            self.splits = make_splits(len(self.goals), config.split_mode)
        else:
            self.goals, self.splits = build_goals(catalog, rng or random.Random(config.price_seed),
                                                  config.split_mode, config.goal_source)
            self.index = SearchIndex(catalog.products)
        self.catalog = catalog
        self.max_query_chars = config.max_query_chars
        self.show_attrs = config.show_attrs
        if config.preload_nlp:
            self.start_nlp_preload()
        self._search = functools.lru_cache(maxsize=config.search_cache)(self._search_uncached)
        self._sessions: dict[str, Session] = {}
        self.worker_index, self.worker_urls = 0, []
        self._lock = threading.Lock()
        self.load_seconds = time.perf_counter() - t0
        log.info("shop ready: %d products, %d %s goals (%s split: %s) in %.2f s", len(catalog.products),
                 len(self.goals), "human" if catalog.human_goals else "synthetic", self.splits.mode,
                 ", ".join(f"{s} {self.splits.size(s)}" for s in SPLITS), self.load_seconds)

    def search(self, query: str) -> list[str]:
        """Top ASINs for ``query`` (BM25, Lucene parameters); the last ``config.search_cache``
        distinct queries' results are kept (the rollouts of one task often search the same words)."""
        return list(self._search(query))

    def _search_uncached(self, query: str) -> tuple[str, ...]:
        return tuple(self.index.search(query))

    def describe(self) -> dict[str, Any]:
        """Summary for ``/health``."""
        return {
            "num_products": len(self.catalog.products),
            "num_goals": len(self.goals),
            "goal_source": "human" if self.catalog.human_goals else "synthetic",
            "split_mode": self.splits.mode,
            "splits": {s: self.splits.size(s) for s in SPLITS},
            "sessions": len(self._sessions),
            "workers": max(1, len(self.worker_urls)),
            "worker": self.worker_index,
            "search_cache": {"hits": self._search.cache_info().hits, "misses": self._search.cache_info().misses},
            "nlp_ready": nlp_ready(),
            "products_file": Path(self.catalog.source).name,
        }

    def start_nlp_preload(self) -> None:
        """Load spaCy in a background thread (the first purchase then does not wait for it)."""
        threading.Thread(target=preload_nlp, name="spacy-preload", daemon=True).start()

    # ----- worker processes ----------------------------------------------------------------------
    def set_worker(self, index: int, urls: list[str]) -> None:
        """Serve as worker ``index`` of ``len(urls)`` processes; ``urls[i]`` is worker i's own address.

        Session ids then start with ``w<index>.``; a request for another worker's session is
        answered with a redirect to that worker (``owner_url``).
        """
        if not 0 <= index < len(urls):
            raise ValueError(f"worker index {index} out of range for {len(urls)} workers")
        self.worker_index, self.worker_urls = index, list(urls)
        self._search.cache_clear()

    def owner_url(self, sid: str) -> str | None:
        """Address of the other worker that owns ``sid``, or None (ours, unknown, or one process)."""
        if not self.worker_urls or not sid.startswith("w") or "." not in sid[:8]:
            return None
        head = sid[1:sid.index(".")]
        if not head.isdigit() or int(head) == self.worker_index or int(head) >= len(self.worker_urls):
            return None
        return self.worker_urls[int(head)]

    @property
    def session_url(self) -> str | None:
        """This worker's own address (where its sessions are served), None with one process."""
        return self.worker_urls[self.worker_index] if self.worker_urls else None

    # ----- sessions ----------------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        ttl = self.config.session_ttl_s
        stale = [sid for sid, s in self._sessions.items() if now - s.last_used > ttl]
        for sid in stale:
            del self._sessions[sid]
        if stale:
            log.info("expired %d idle sessions", len(stale))

    def create_session(self, goal_index: int) -> Session:
        """New session for goal ``goal_index`` (global index into the shuffled goals).

        Raises:
            ValueError: goal index out of range; ShopFull: too many live sessions.
        """
        if not 0 <= goal_index < len(self.goals):
            raise ValueError(f"goal index {goal_index} out of range [0, {len(self.goals)})")
        sid = secrets.token_urlsafe(18)
        if self.worker_urls:  # the worker's index travels in the id, so any worker can route it
            sid = f"w{self.worker_index}.{sid}"
        session = Session(sid, self.goals[goal_index], goal_index, self)
        with self._lock:
            now = time.monotonic()
            self._expire(now)
            if len(self._sessions) >= self.config.max_sessions:
                raise ShopFull(f"{len(self._sessions)} live sessions (max_sessions); close some first")
            self._sessions[sid] = session
        return session

    def get_session(self, sid: str) -> Session | None:
        """The live session ``sid`` (touching it), or None when unknown or expired."""
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                return None
            now = time.monotonic()
            if now - session.last_used > self.config.session_ttl_s:
                del self._sessions[sid]
                return None
            session.last_used = now
            return session

    def close_session(self, sid: str) -> bool:
        """Drop ``sid``; True when it existed."""
        with self._lock:
            return self._sessions.pop(sid, None) is not None
