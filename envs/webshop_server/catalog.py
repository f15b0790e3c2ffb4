"""Loading a WebShop product catalog the way the original ``web_agent_site`` does.

Source: Yao et al. 2022, "WebShop" (princeton-nlp/WebShop, ``web_agent_site/engine/engine.py``:
``load_products`` and ``generate_product_prices``). Re-implemented here (not copied): the same
normalisation of every product (title, description, bullet points, price tag, option values with
``/`` replaced by `` | `` and lower-cased, attributes from ``items_ins_v2_*.json``), the same skip
rules (ASIN ``nan`` or longer than 10 characters, duplicate ASINs) and the same price draws
(``random.uniform`` over a price range, one draw per ranged product in catalog order, from an RNG
seeded with ``price_seed``; ``Random(0)`` reproduces the reference cases in
``reward_cases_dev.jsonl``).

Products are streamed from the JSON array one object at a time (``json.JSONDecoder.raw_decode``
over a sliding text buffer), so a large ``items_shuffle.json`` is never held twice in memory:
each raw product is turned into a slim product dict and the raw dict is dropped.
"""

from __future__ import annotations

import json
import logging
import random
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from envs.webshop_server.paths import default_data_dir, require_path

log = logging.getLogger(__name__)

#: product files tried in this order when none is named (the original's default is the 1k file)
PRODUCT_FILES = ("items_shuffle_1000.json", "items_shuffle.json", "items_shuffle_prefix.json")
ATTRIBUTE_FILES = ("items_ins_v2_1000.json", "items_ins_v2.json")
HUMAN_GOALS_FILE = "items_human_ins.json"
REVIEWS_FILE = "reviews.json"
_CHUNK_CHARS = 1 << 20


def iter_json_array(path: Path, chunk_chars: int = _CHUNK_CHARS) -> Iterator[Any]:
    """Yield the elements of a top-level JSON array one at a time (incremental parsing).

    Only the current text window (``chunk_chars`` plus one element) is held in memory.

    Raises:
        ValueError: the file does not hold a JSON array, naming the file and offset.
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf = f.read(chunk_chars)
        pos = 0
        while True:
            while pos < len(buf) and buf[pos].isspace():
                pos += 1
            if pos < len(buf):
                break
            more = f.read(chunk_chars)
            if not more:
                raise ValueError(f"{path}: empty file, expected a JSON array")
            buf, pos = buf[pos:] + more, 0
        if buf[pos] != "[":
            raise ValueError(f"{path}: expected a JSON array, found {buf[pos]!r} at the start")
        pos += 1
        eof = False
        while True:
            while pos < len(buf) and (buf[pos].isspace() or buf[pos] == ","):
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
                if end >= len(buf) and not eof:  # a number cut by the window end would parse short
                    raise IndexError
            except (json.JSONDecodeError, IndexError):
                if eof:
                    raise ValueError(f"{path}: truncated or malformed JSON array") from None
                more = f.read(chunk_chars)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            yield obj
            pos = end
            if len(buf) - pos < chunk_chars // 4 and not eof:
                more = f.read(chunk_chars)
                eof = not more
                buf, pos = buf[pos:] + more, 0


def _skip_space(buf: str, pos: int) -> int:
    while pos < len(buf) and buf[pos].isspace():
        pos += 1
    return pos


def iter_json_object(path: Path, chunk_chars: int = _CHUNK_CHARS) -> Iterator[tuple[str, Any]]:
    """Yield the ``(key, value)`` pairs of a top-level JSON object one at a time (incremental parsing).

    Raises:
        ValueError: the file does not hold a JSON object, naming the file.
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = f.read(chunk_chars), 0, False
        while True:
            try:
                while buf[pos].isspace():
                    pos += 1
                if buf[pos] != "{":
                    raise ValueError(f"{path}: expected a JSON object, found {buf[pos]!r} at the start")
                pos += 1
                break
            except IndexError:
                more = f.read(chunk_chars)
                if not more:
                    raise ValueError(f"{path}: empty file, expected a JSON object") from None
                buf += more
        while True:
            end = pos
            while end < len(buf) and (buf[end].isspace() or buf[end] == ","):
                end += 1
            if end < len(buf) and buf[end] == "}":
                return
            try:
                key, end = decoder.raw_decode(buf, end)
                end = _skip_space(buf, end)
                if buf[end] != ":" or not isinstance(key, str):
                    raise ValueError(f"{path}: malformed JSON object near {buf[pos:pos + 40]!r}")
                value, end = decoder.raw_decode(buf, _skip_space(buf, end + 1))
                if end >= len(buf) and not eof:  # a number cut by the window end would parse short
                    raise IndexError
            except (json.JSONDecodeError, IndexError):
                if eof:
                    raise ValueError(f"{path}: truncated or malformed JSON object") from None
                more = f.read(chunk_chars)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            yield key, value
            pos = end
            if len(buf) - pos < chunk_chars // 4 and not eof:
                more = f.read(chunk_chars)
                eof = not more
                buf, pos = buf[pos:] + more, 0


def _parse_pricing(pricing: Any) -> tuple[list[float], str]:
    """Price string like ``"$12.99 - $20.00"`` -> ([12.99, 20.0], "$12.99 to $20.0") (original rule)."""
    if not pricing:
        return [100.0], "$100.0"
    values = [float(Decimal(re.sub(r"[^\d.]", "", part))) for part in str(pricing).split("$")[1:]]
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def _normalise_options(raw: Any) -> tuple[dict[str, list[str]], dict[str, Any]]:
    options: dict[str, list[str]] = {}
    option_to_image: dict[str, Any] = {}
    for name, contents in (raw or {}).items():
        if contents is None:
            continue
        values = []
        for content in contents:
            value = content["value"].strip().replace("/", " | ").lower()
            values.append(value)
            option_to_image[value] = content.get("image")
        options[name.lower()] = values
    return options, option_to_image


def normalise_product(
    raw: dict[str, Any],
    attr_entry: tuple | None,
    instructions: list[dict[str, Any]] | None,
    reviews: dict[str, tuple[list, Any]],
) -> dict[str, Any]:
    """One raw catalog product -> the slim product dict the server uses (original field names).

    Args:
        raw: the product as in ``items_shuffle*.json``.
        attr_entry: its ``read_attributes`` entry ``(attributes, instruction, instruction_attributes)``
            or None when the attributes file has no entry for it.
        instructions: its human instructions (``items_human_ins.json`` entry) or None.
        reviews: ASIN -> (reviews, average rating).

    Both goal sources' fields are kept (``instructions`` when given; ``instruction_text`` and
    ``instruction_attributes`` always), so goals can fall back from human to synthetic.
    """
    asin = raw["asin"]
    bullets = raw.get("small_description")
    bullets = bullets if isinstance(bullets, list) else [bullets]
    pricing, price_tag = _parse_pricing(raw.get("pricing"))
    options, option_to_image = _normalise_options(raw.get("customization_options"))
    attrs, instruction, instruction_attrs = attr_entry if attr_entry is not None else (None, None, None)
    product_reviews, rating = reviews.get(asin, ([], "N.A."))
    product = {
        "asin": asin,
        "name": raw["name"],
        "Title": raw["name"],
        "Description": raw.get("full_description") or "",
        "BulletPoints": bullets,
        "pricing": pricing,
        "Price": price_tag,
        "options": options,
        "option_to_image": option_to_image,
        "Attributes": list(attrs) if attrs is not None else ["DUMMY_ATTR"],
        "MainImage": (raw.get("images") or [None])[0],
        "category": raw.get("category"),
        "query": str(raw.get("query", "")).lower().strip(),
        "product_category": raw.get("product_category", ""),
        "Reviews": product_reviews,
        "Rating": rating,
        "instruction_text": instruction,
        "instruction_attributes": list(instruction_attrs) if instruction_attrs is not None else None,
    }
    if instructions is not None:
        product["instructions"] = instructions
    return product


def _load_reviews(path: Path) -> dict[str, tuple[list, Any]]:
    out: dict[str, tuple[list, Any]] = {}
    for r in iter_json_array(path):
        items = []
        for rev in r.get("reviews", []):
            rev = dict(rev)
            if "score" not in rev:
                rev["score"] = rev.pop("stars", 0)
            rev["body"] = rev.pop("review", "") if "review" in rev else ""
            items.append(rev)
        out[r["asin"]] = (items, r.get("average_rating", "N.A."))
    return out


def read_attributes(path: Path) -> dict[str, tuple]:
    """``items_ins_v2*.json`` streamed into ASIN -> ``(attributes, instruction, instruction_attributes)``.

    Tuples of interned strings (attribute phrases repeat across products), or None where the entry
    lacks the field; compact enough for the full catalog's file (its size: docs/webshop.md, "Full scale").

    Raises:
        ValueError: the file is not a JSON object of objects (names the file and the entry).
    """
    intern = sys.intern
    out: dict[str, tuple] = {}
    for asin, entry in iter_json_object(path):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: entry {asin!r}: expected an object, got {type(entry).__name__}")
        attrs, ins_attrs = entry.get("attributes"), entry.get("instruction_attributes")
        out[intern(asin)] = (
            None if attrs is None else tuple(intern(a) for a in attrs),
            entry.get("instruction"),
            None if ins_attrs is None else tuple(intern(a) for a in ins_attrs),
        )
    return out


_HUMAN_FIELDS = {"instruction": str, "instruction_attributes": list, "instruction_options": (list, dict)}


def read_human_instructions(path: Path) -> dict[str, list[dict[str, Any]]]:
    """``items_human_ins.json``: ASIN -> list of ``{"instruction", "instruction_attributes",
    "instruction_options", ...}`` (the original's format), checked entry by entry.

    Raises:
        ValueError: not valid JSON, not an object of lists, or an instruction missing a field or
            with a field of the wrong type; one line naming the file and the entry.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object (ASIN -> list of instructions), got {type(data).__name__}")
    for asin, items in data.items():
        if not isinstance(items, list):
            raise ValueError(f"{path}: entry {asin!r}: expected a list of instructions, got {type(items).__name__}")
        for k, ins in enumerate(items):
            if not isinstance(ins, dict):
                raise ValueError(f"{path}: entry {asin!r}[{k}]: expected an object, got {type(ins).__name__}")
            for name, kind in _HUMAN_FIELDS.items():
                if name not in ins:
                    raise ValueError(f"{path}: entry {asin!r}[{k}]: missing {name!r}")
                if not isinstance(ins[name], kind):
                    raise ValueError(f"{path}: entry {asin!r}[{k}]: {name!r} has type {type(ins[name]).__name__}")
    return data


@dataclass
class Catalog:
    """The loaded products and their prices.

    Attributes:
        products: product dicts in catalog order (original field names: ``Title``, ``Description``,
            ``BulletPoints``, ``Price``, ``pricing``, ``options``, ``Attributes``, ...); a list, or a
            lazy read-only sequence for a disk catalog (``envs.webshop_server.store``).
        by_asin: ASIN -> product dict (same objects; a lazy mapping for a disk catalog).
        prices: ASIN -> price in dollars (a fixed draw from the product's price range).
        human_goals: True when human instructions were attached (``items_human_ins.json``).
        source: the products file read.
        human_file: the human instructions file read (None: synthetic goals only).
    """

    products: Sequence[dict[str, Any]]
    by_asin: Mapping[str, dict[str, Any]]
    prices: Mapping[str, float]
    human_goals: bool
    source: Path
    human_file: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def draw_price(product: dict[str, Any], rng: random.Random) -> float:
    """Price of one product as the original ``generate_product_prices``: fixed, or uniform in the range
    (one ``rng.uniform`` draw per ranged product, in catalog order)."""
    pricing = product["pricing"]
    if not pricing:
        return 100.0
    if len(pricing) == 1:
        return pricing[0]
    return rng.uniform(*pricing[:2])


def draw_prices(products: Iterable[dict[str, Any]], rng: random.Random) -> dict[str, float]:
    """Price per ASIN (``draw_price`` over the products in order)."""
    return {p["asin"]: draw_price(p, rng) for p in products}


def resolve_files(data_dir: str | Path | None, products_file: str | None) -> dict[str, Path | None]:
    """Find the catalog files in ``data_dir`` (default :func:`~envs.webshop_server.paths.default_data_dir`).

    Raises:
        FileNotFoundError: no products file or no attributes file, naming the folder and names tried.
    """
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    require_path(root, "WebShop data folder", "Pass --data-dir or set PROGPO_DATA.")
    if products_file is not None:
        prod = require_path(root / products_file, "WebShop products file (--products-file)")
    else:
        found = [root / n for n in PRODUCT_FILES if (root / n).exists()]
        if not found:
            raise FileNotFoundError(f"no WebShop products file in {root}; tried {list(PRODUCT_FILES)}")
        prod = found[0]
    # the attributes file of the same release: *_1000 files together (the 87-product prefix is
    # part of the 1k catalog), the full catalog with the full attributes file
    order = ATTRIBUTE_FILES if ("_1000" in prod.name or "prefix" in prod.name) else ATTRIBUTE_FILES[::-1]
    attrs = [root / n for n in order if (root / n).exists()]
    if not attrs:
        raise FileNotFoundError(f"no WebShop attributes file in {root}; tried {list(ATTRIBUTE_FILES)}")
    human = root / HUMAN_GOALS_FILE
    reviews = root / REVIEWS_FILE
    return {
        "products": prod,
        "attributes": attrs[0],
        "human": human if human.exists() else None,
        "reviews": reviews if reviews.exists() else None,
    }


def check_options(num_products: int | None, goal_source: str) -> None:
    """Raises ValueError naming a bad ``goal_source`` / ``num_products``."""
    if goal_source not in ("auto", "human", "synthetic"):
        raise ValueError(f"goal_source must be auto, human or synthetic, got {goal_source!r}")
    if num_products is not None and num_products < 1:
        raise ValueError(f"num_products must be >= 1, got {num_products}")


def iter_products(files: dict[str, Path | None], *, num_products: int | None = None,
                  goal_source: str = "auto") -> Iterator[dict[str, Any]]:
    """Stream the normalised products of ``files`` (``resolve_files``) with the original's skip rules
    (ASIN ``nan``, longer than 10 characters, or seen before; only the first ``num_products`` raw
    products). Human instructions are attached when ``goal_source`` is ``human``, or ``auto`` and the
    file exists.

    Raises:
        ValueError: bad option or malformed attributes / human-goals file (naming the file);
            FileNotFoundError: ``goal_source="human"`` without ``items_human_ins.json``.
    """
    check_options(num_products, goal_source)
    if goal_source == "human" and files["human"] is None:
        raise FileNotFoundError(f"goal_source='human' needs {HUMAN_GOALS_FILE} in the data folder")
    use_human = goal_source != "synthetic" and files["human"] is not None
    attributes = read_attributes(files["attributes"])  # type: ignore[arg-type]
    human = read_human_instructions(files["human"]) if use_human else {}  # type: ignore[arg-type]
    reviews = _load_reviews(files["reviews"]) if files["reviews"] is not None else {}
    seen: set[str] = set()
    for i, raw in enumerate(iter_json_array(files["products"])):  # type: ignore[arg-type]
        if num_products is not None and i >= num_products:
            break
        if not isinstance(raw, dict):
            raise ValueError(f"{files['products']}: product {i}: expected an object, got {type(raw).__name__}")
        asin = raw.get("asin")
        if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        try:
            yield normalise_product(raw, attributes.get(asin), human.get(asin) if use_human else None, reviews)
        except (KeyError, TypeError, AttributeError, ValueError, ArithmeticError) as e:
            raise ValueError(f"{files['products']}: product {i} (asin {asin!r}): {type(e).__name__}: {e}") from None


def load_catalog(
    data_dir: str | Path | None = None,
    *,
    products_file: str | None = None,
    num_products: int | None = None,
    goal_source: str = "auto",
    price_seed: int = 0,
) -> tuple[Catalog, random.Random]:
    """Stream and normalise a WebShop catalog into memory (small catalogs; large ones: ``store``).

    Args:
        data_dir: folder with ``items_shuffle*.json`` and ``items_ins_v2_*.json`` (default:
            ``default_data_dir()``, the 87-product real subset).
        products_file: a file name inside ``data_dir`` to use instead of the default search order.
        num_products: keep only the first N raw products (as the original's ``num_products``).
        goal_source: ``"auto"`` (human goals when ``items_human_ins.json`` exists, else synthetic),
            ``"human"`` or ``"synthetic"``.
        price_seed: seeds the RNG that draws prices (and then goal price bounds, continuing the
            same stream, as the original does with its global ``random``).

    Returns:
        (catalog, rng): the RNG after the price draws, to be passed on to goal generation.

    Raises:
        ValueError: bad ``goal_source`` / ``num_products`` or malformed files; FileNotFoundError:
            missing files.
    """
    check_options(num_products, goal_source)
    files = resolve_files(data_dir, products_file)
    products = list(iter_products(files, num_products=num_products, goal_source=goal_source))
    if not products:
        raise ValueError(f"{files['products']}: no usable products")
    rng = random.Random(price_seed)
    prices = draw_prices(products, rng)
    by_asin = {p["asin"]: p for p in products}
    human = goal_source != "synthetic" and files["human"] is not None
    log.info("loaded %d products from %s", len(products), files["products"])
    return Catalog(products, by_asin, prices, human, files["products"], files["human"] if human else None), rng
