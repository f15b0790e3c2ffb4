"""On-disk cache of large catalogs: one store folder (``envs.webshop_server.store``) per content key.

Key: SHA-256 of the products / attributes / human-goals / reviews files' *contents*, plus
``num_products``, ``goal_source``, ``price_seed`` and the store version, so a changed file is never
served from a stale cache (and a copied or touched file with the same bytes still hits it). Hashing
5 GB takes seconds, so each file's digest is remembered in ``digests.json`` next to its stat
signature (device, inode, size, mtime and ctime in ns); any write to the file changes its ctime,
which no user tool can set back, so an unchanged signature means unchanged bytes.

Writes are atomic and safe under concurrency: a build runs under an exclusive ``flock`` on
``<key>.lock`` (a second server starting on the same cache waits, then opens what the first built),
into a temporary folder that is renamed to ``<key>/`` only when complete; a killed build leaves only
a temporary folder, removed by the next build. Default folder ``~/.cache/progpo/webshop``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envs.webshop_server.catalog import Catalog, load_catalog, resolve_files
from envs.webshop_server.goals import make_goals
from envs.webshop_server.search import SearchIndex
from envs.webshop_server.store import STORE_VERSION, build_store, open_store

log = logging.getLogger(__name__)
CACHE_VERSION = 2
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "progpo" / "webshop"
_HASH_BLOCK = 8 << 20


def _signature(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def file_digest(path: Path, memo_dir: Path | None = None) -> str:
    """SHA-256 (hex) of ``path``'s bytes; remembered in ``memo_dir/digests.json`` by stat signature."""
    path = Path(path).resolve()
    memo_file = memo_dir / "digests.json" if memo_dir is not None else None
    memo: dict[str, Any] = {}
    if memo_file is not None:
        with contextlib.suppress(OSError, ValueError):
            memo = json.loads(memo_file.read_text())
    sig = _signature(path)
    entry = memo.get(str(path))
    if isinstance(entry, dict) and entry.get("sig") == sig:
        return entry["sha256"]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            h.update(block)
    digest = h.hexdigest()
    if memo_file is not None and _signature(path) == sig:  # unchanged while hashing
        memo[str(path)] = {"sig": sig, "sha256": digest}
        with contextlib.suppress(OSError):
            fd, tmp = tempfile.mkstemp(prefix=".digests.", dir=memo_dir)
            with os.fdopen(fd, "w") as f:
                json.dump(memo, f)
            os.replace(tmp, memo_file)
    return digest


def cache_key(config: Any, memo_dir: Path | None = None) -> tuple[str, dict[str, Path | None]]:
    """(key, files) for ``config`` (a ``ShopConfig``); the key hashes the files' contents."""
    files = resolve_files(config.data_dir, config.products_file)
    parts: dict[str, Any] = {"v": [CACHE_VERSION, STORE_VERSION], "num_products": config.num_products,
                             "goal_source": config.goal_source, "price_seed": config.price_seed}
    for name, path in files.items():
        parts[name] = None if path is None else file_digest(path, memo_dir)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24], files


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is building this catalog cache (%s); waiting for it", lock_path)
            t0 = time.monotonic()
            fcntl.flock(f, fcntl.LOCK_EX)
            log.info("cache lock acquired after %.1f s", time.monotonic() - t0)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build_locked(config: Any, key: str, files: dict[str, Path | None], root: Path) -> Path:
    """Build ``root/key`` under the key's lock unless another process did (returns the folder)."""
    folder = root / key
    with _exclusive(root / f"{key}.lock"):
        if (folder / "meta.json").exists():
            return folder
        for stale in root.glob(f".{key}.*"):  # a killed build's leftovers (we hold the lock)
            log.info("removing unfinished cache build %s", stale)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        try:
            log.info("building catalog cache %s from %s (one pass; large catalogs take minutes)", folder,
                     files["products"])
            meta = build_store(files, tmp / "store", num_products=config.num_products,
                               goal_source=config.goal_source, price_seed=config.price_seed)
            os.rename(tmp / "store", folder)  # atomic: the folder appears complete or not at all
            log.info("cached catalog in %s: %s", folder, meta["seconds"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def load_or_build(config: Any) -> tuple[Catalog, list[dict], SearchIndex]:
    """Catalog, shuffled goals and search index for ``config`` (a ``ShopConfig``).

    Products files of ``config.cache_min_mb`` or more (and ``use_cache``) go through the disk
    store, built once per content key; smaller ones (or when the cache folder cannot be written)
    are loaded into memory.

    Raises:
        ValueError / FileNotFoundError: bad options, missing or malformed files (naming them).
    """
    files = resolve_files(config.data_dir, config.products_file)
    if config.use_cache and files["products"].stat().st_size >= config.cache_min_mb * 2**20:
        root = Path(config.cache_dir).expanduser() if config.cache_dir else DEFAULT_CACHE_DIR
        try:
            try:
                root.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise ValueError(f"catalog cache folder (--cache-dir) {root} is a file or lies under one; "
                                 "pass a folder, or --no-cache") from None
            key, files = cache_key(config, memo_dir=root)
            folder = root / key
            if not (folder / "meta.json").exists():
                folder = _build_locked(config, key, files, root)
            else:
                log.info("catalog cache hit: %s", folder)
            return open_store(folder)
        except PermissionError as e:
            log.warning("cannot use the catalog cache in %s (%s); loading into memory", root, e)
    catalog, rng = load_catalog(config.data_dir, products_file=config.products_file,
                                num_products=config.num_products, goal_source=config.goal_source,
                                price_seed=config.price_seed)
    goals, catalog.human_goals = make_goals(catalog.products, catalog.prices, rng, human=catalog.human_goals,
                                            goal_source=config.goal_source, human_file=catalog.human_file)
    return catalog, goals, SearchIndex(catalog.products)

