"""A large WebShop catalog on disk: normalised once, then read lazily and shared between processes.

``build_store`` streams the raw files once (one raw product in memory at a time) and writes a folder:

==========================  =====================================================================
``products.bin``            the normalised products (``catalog.normalise_product``), one orjson
                            record each, concatenated in catalog order
``offsets.npy``             int64 ``[n + 1]``: byte offset of each record
``asins.npy``               ``<U10`` ``[n]``: ASIN of each row (catalog order = index document order)
``asins_sorted.npy``,       the ASINs sorted and the row of each (ASIN lookup by binary search);
``sorted_rows.npy``         ``asin_rank.npy`` int64 ``[n]``: each row's place in that order (ties)
``prices.npy``              float64 ``[n]``: the price drawn for each row (original rule and order)
``index/``                  the BM25 index in bm25s' file format (``search.IndexBuilder``)
``goals.pkl``               the shuffled goal list and whether it is human or synthetic
``meta.json``               sizes, source files, counts
==========================  =====================================================================

``open_store`` memory-maps the arrays and the index (read-only, so N worker processes share one
copy through the page cache) and reads a product record with ``os.pread`` only when a page needs
it (an LRU of decoded products per process), so a warm start loads no product at all.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pickle
import random
import resource
import time
from array import array
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from envs.webshop_server.catalog import Catalog, check_options, draw_price, iter_products
from envs.webshop_server.goals import make_goals
from envs.webshop_server.search import BackgroundIndexBuilder, IndexBuilder, SearchIndex, document_text

log = logging.getLogger(__name__)
STORE_VERSION = 1
PRODUCT_CACHE = 4096  # decoded products kept per process


class ProductStore(Sequence):
    """Read-only products of a store folder, by row (catalog order); decoded on access.

    Returned dicts are shared (cached): callers must not modify them.
    """

    def __init__(self, folder: Path, cache_size: int = PRODUCT_CACHE) -> None:
        self.folder = folder
        self._offsets = np.load(folder / "offsets.npy", mmap_mode="r")
        self.asins = np.load(folder / "asins.npy", mmap_mode="r")
        self._sorted = np.load(folder / "asins_sorted.npy", mmap_mode="r")
        self._sorted_rows = np.load(folder / "sorted_rows.npy", mmap_mode="r")
        self.asin_rank = np.load(folder / "asin_rank.npy", mmap_mode="r")
        self.price_array = np.load(folder / "prices.npy", mmap_mode="r")
        self._fd = os.open(folder / "products.bin", os.O_RDONLY)
        self._get = functools.lru_cache(maxsize=cache_size)(self._read)

    def _read(self, row: int) -> dict[str, Any]:
        lo, hi = int(self._offsets[row]), int(self._offsets[row + 1])
        return orjson.loads(os.pread(self._fd, hi - lo, lo))

    def __len__(self) -> int:
        return len(self.asins)

    def __getitem__(self, row: Any) -> Any:
        if isinstance(row, slice):
            return [self._get(i) for i in range(*row.indices(len(self)))]
        row = int(row)
        if row < 0:
            row += len(self)
        if not 0 <= row < len(self):
            raise IndexError(f"product row {row} out of range [0, {len(self)})")
        return self._get(row)

    def row_of(self, asin: Any) -> int | None:
        """Row of ``asin``, or None when it is not in the catalog."""
        if not isinstance(asin, str) or not 0 < len(asin) <= 10:
            return None
        i = int(np.searchsorted(self._sorted, asin))
        if i < len(self._sorted) and self._sorted[i] == asin:
            return int(self._sorted_rows[i])
        return None

    def close(self) -> None:
        """Close the records file (the store is unusable afterwards)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _ByAsin(Mapping):
    """ASIN -> product dict over a ``ProductStore``."""

    def __init__(self, store: ProductStore) -> None:
        self._store = store

    def __getitem__(self, asin: str) -> dict[str, Any]:
        row = self._store.row_of(asin)
        if row is None:
            raise KeyError(asin)
        return self._store[row]

    def __len__(self) -> int:
        return len(self._store)

    def __iter__(self) -> Iterator[str]:
        return (str(a) for a in self._store.asins)


class _Prices(_ByAsin):
    """ASIN -> price over a ``ProductStore``."""

    def __getitem__(self, asin: str) -> float:  # type: ignore[override]
        row = self._store.row_of(asin)
        if row is None:
            raise KeyError(asin)
        return float(self._store.price_array[row])


def _write_lookup(folder: Path, asins: list[str]) -> np.ndarray:
    arr = np.array(asins, dtype="<U10")
    np.save(folder / "asins.npy", arr)
    order = np.argsort(arr, kind="stable")
    np.save(folder / "asins_sorted.npy", arr[order])
    np.save(folder / "sorted_rows.npy", order.astype(np.int64))
    rank = np.empty(len(arr), dtype=np.int64)
    rank[order] = np.arange(len(arr))
    np.save(folder / "asin_rank.npy", rank)
    return arr


def build_store(files: dict[str, Path | None], folder: Path, *, num_products: int | None = None,
                goal_source: str = "auto", price_seed: int = 0, log_every: int = 100_000,
                background_index: bool = True) -> dict[str, Any]:
    """Stream ``files`` (``catalog.resolve_files``) into a store in ``folder`` (created; must be new).

    One pass over the products: normalise, write the record, draw the price (``Random(price_seed)``,
    catalog order, as the original), feed the index builder; the goals are then made from the
    rows that can carry one (continuing the same RNG) and the index is finished. With
    ``background_index`` the texts are tokenised and indexed in a child process
    (``search.BackgroundIndexBuilder``), on a second core.

    Returns:
        the ``meta.json`` content (sizes, counts, seconds per stage).

    Raises:
        ValueError: bad options, malformed files or no usable product (naming the file).
    """
    check_options(num_products, goal_source)
    folder.mkdir(parents=True)
    builder = BackgroundIndexBuilder(spill_dir=folder) if background_index else IndexBuilder(spill_dir=folder)
    try:
        meta = _write_store(files, folder, builder, num_products=num_products, goal_source=goal_source,
                            price_seed=price_seed, log_every=log_every)
    except BaseException:
        if isinstance(builder, BackgroundIndexBuilder):
            builder.close()
        raise
    if background_index:  # the child's peak memory (it has been waited for)
        meta["index_builder_peak_mib"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def _write_store(files: dict[str, Path | None], folder: Path, builder: Any, *, num_products: int | None,
                 goal_source: str, price_seed: int, log_every: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    rng = random.Random(price_seed)
    asins: list[str] = []
    offsets, prices = array("q", [0]), array("d")
    human_rows, synthetic_rows = array("q"), array("q")
    with open(folder / "products.bin", "wb") as out:
        for product in iter_products(files, num_products=num_products, goal_source=goal_source):
            row = len(asins)
            record = orjson.dumps(product)
            out.write(record)
            offsets.append(offsets[-1] + len(record))
            asins.append(product["asin"])
            prices.append(draw_price(product, rng))
            builder.add(document_text(product))
            if product.get("instructions"):
                human_rows.append(row)
            if product.get("instruction_text") is not None:
                synthetic_rows.append(row)
            if log_every and (row + 1) % log_every == 0:
                log.info("store: %d products normalised and tokenised (%.0f s)", row + 1, time.perf_counter() - t0)
    if not asins:
        raise ValueError(f"{files['products']}: no usable products")
    t_parse = time.perf_counter() - t0
    np.save(folder / "offsets.npy", np.frombuffer(offsets, dtype=np.int64))
    np.save(folder / "prices.npy", np.frombuffer(prices, dtype=np.float64))
    _write_lookup(folder, asins)
    del asins
    store = ProductStore(folder)
    human = goal_source != "synthetic" and files["human"] is not None
    rows = human_rows if human else synthetic_rows

    def goal_products(selected) -> Iterator[dict[str, Any]]:
        return (store[r] for r in selected)

    goals, human_used = make_goals(list(goal_products(rows)), _Prices(store), rng, human=human,
                                   goal_source=goal_source, human_file=files["human"],
                                   fallback=lambda: list(goal_products(synthetic_rows)))
    store.close()
    with open(folder / "goals.pkl", "wb") as f:
        pickle.dump({"goals": goals, "human": human_used}, f, protocol=pickle.HIGHEST_PROTOCOL)
    t_goals = time.perf_counter() - t0 - t_parse
    builder.finish(folder / "index")
    return {
        "version": STORE_VERSION, "num_products": len(offsets) - 1, "num_goals": len(goals),
        "human_goals": human_used, "products_file": str(files["products"]),
        "human_file": str(files["human"]) if human_used else None,
        "vocab": builder.vocab_size if hasattr(builder, "vocab_size") else len(builder.vocab),
        "postings": int(builder.num_postings), "seconds": {
            "stream": round(t_parse, 2), "goals": round(t_goals, 2),
            "index": round(time.perf_counter() - t0 - t_parse - t_goals, 2)},
    }


def open_store(folder: Path) -> tuple[Catalog, list[dict], SearchIndex]:
    """(catalog, shuffled goals, search index) of a store written by ``build_store`` (memory-mapped).

    Raises:
        ValueError: the folder is not a complete store of this version.
    """
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{folder}: not a WebShop store ({e})") from None
    if meta.get("version") != STORE_VERSION:
        raise ValueError(f"{folder}: store version {meta.get('version')}, expected {STORE_VERSION}")
    store = ProductStore(folder)
    with open(folder / "goals.pkl", "rb") as f:
        saved = pickle.load(f)
    human_file = Path(meta["human_file"]) if meta["human_file"] else None
    log.info("cached goals: %d usable %s goals%s", len(saved["goals"]), "human" if saved["human"] else "synthetic",
             f" from {human_file}" if human_file else "")
    catalog = Catalog(store, _ByAsin(store), _Prices(store), saved["human"], Path(meta["products_file"]), human_file)
    index = SearchIndex.load(folder / "index", store.asins, store.asin_rank)
    return catalog, saved["goals"], index
