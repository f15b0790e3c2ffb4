"""``python -m envs.webshop_server.synth --products N --out DIR``: a synthetic WebShop catalog at any scale.

Writes the standard WebShop files (same names and formats as the real ones, so the server, the
original loader and any WebShop tool read them unchanged):

* ``items_shuffle.json``: one JSON array of raw products on one line, as the real 5.1 GB file
  (``json.dump`` separators, ASCII escapes), with every field of the real products;
* ``items_ins_v2.json``: ``{asin: {"attributes": [...], "instruction": ..., "instruction_attributes": [...]}}``
  (instruction fields on about 41.5 % of the products, as in ``items_ins_v2_1000.json``);
* ``items_human_ins.json``: ``{asin: [{"asin", "instruction", "instruction_attributes",
  "instruction_options"}, ...]}`` with ``--human-goals`` (12,087) instructions.

Products are made from the real ones, not copied: product ``i`` takes a base product (one of the
87 real products of ``items_shuffle_prefix.json``, or of ``items_shuffle_1000.json`` when present)
and a donor of the same category, and recombines and perturbs them: a brand from the catalog's
brands, title words swapped with the donor's and attribute phrases inserted, an optional model
code, description sentences and bullet points drawn from both, option values re-sampled from all
values of that option name in the catalog, the price scaled by a log-normal factor, attributes
from the base product plus phrases of the 1,000 products' attribute pool. Instructions follow
the real files' styles: ``Find me <attributes> <category leaf> with <attributes>`` (items_ins_v2)
and human-style openers mined from the 12,087 real human goals (``human_goals.json``).

Deterministic (product ``i`` depends on ``seed`` and ``i`` only, so the first N products of a
larger catalog are the N-product catalog) and streaming: memory does not grow with ``--products``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from envs.webshop_server.catalog import iter_json_array
from envs.webshop_server.paths import default_data_dir

FULL_PRODUCTS = 1_181_436
HUMAN_GOALS = 12_087
INSTRUCTION_FRAC = 0.415  # 415 of the 1,000 products of items_ins_v2_1000.json have an instruction
_ASIN_SPACE = 36 ** 8
_ASIN_MUL = 1_125_899_906_842_597 % _ASIN_SPACE | 1  # odd and not a multiple of 3: a bijection mod 36^8
_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
GENERATOR_VERSION = 1
MARKER = "synth.json"
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def synthetic_asin(i: int, seed: int) -> str:
    """A unique 10-character ASIN for product ``i`` (``B`` + seed letter + 8 base-36 digits, bijective in ``i``)."""
    if not 0 <= i < _ASIN_SPACE:
        raise ValueError(f"product index {i} outside [0, 36^8)")
    x = (i * _ASIN_MUL + 7_919 * (seed + 1)) % _ASIN_SPACE
    digits = []
    for _ in range(8):
        x, d = divmod(x, 36)
        digits.append(_DIGITS[d])
    return "B" + _DIGITS[seed % 26 + 10] + "".join(digits)


class Pools:
    """What products are recombined from (read once from the real files; small)."""

    def __init__(self, src: Path) -> None:
        name = "items_shuffle_1000.json" if (src / "items_shuffle_1000.json").exists() else "items_shuffle_prefix.json"
        self.bases = list(iter_json_array(src / name))
        with open(src / "items_ins_v2_1000.json", encoding="utf-8") as f:
            ins = json.load(f)
        self.base_attrs = {a: list(v.get("attributes") or []) for a, v in ins.items()}
        self.attr_pool = sorted({a for v in ins.values() for a in v.get("attributes") or []})
        self.by_category: dict[str, list[dict]] = defaultdict(list)
        self.option_values: dict[str, list[dict]] = defaultdict(list)
        seen: set[tuple[str, str]] = set()
        brands = set()
        for p in self.bases:
            self.by_category[p.get("category") or ""].append(p)
            for opt, contents in (p.get("customization_options") or {}).items():
                for c in contents or []:
                    if (opt.lower(), c["value"]) not in seen:
                        seen.add((opt.lower(), c["value"]))
                        self.option_values[opt.lower()].append(c)
            brand = str(p.get("brand") or "").removeprefix("Brand: ").strip()
            if brand:
                brands.add(brand)
        self.brands = sorted(brands)
        self.openers = self._openers(src / "human_goals.json")

    @staticmethod
    def _openers(path: Path) -> list[tuple[str, int]]:
        """Openers of the real human instructions (``i am looking for``, ``i need a``, ...) with counts."""
        if not path.exists():
            return [("i am looking for", 1)]
        with open(path, encoding="utf-8") as f:
            goals = json.load(f)
        stops = {"for", "a", "an", "some", "to"}
        counts: Counter[str] = Counter()
        for text in goals:
            words = text.split()[:5]
            cut = next((k for k, w in enumerate(words) if w in stops), None)
            if cut is not None:
                counts[" ".join(words[:cut + 1])] += 1
        return sorted((o, c) for o, c in counts.items() if c >= 20)


def _title(base: dict, donor: dict, attrs: list[str], brand: str, r: random.Random) -> str:
    words = str(base.get("name") or "").split()
    old_brand = str(base.get("brand") or "").removeprefix("Brand: ").strip()
    if old_brand and " ".join(words).startswith(old_brand):
        words = brand.split() + words[len(old_brand.split()):]
    donor_words = [w for w in str(donor.get("name") or "").split() if len(w) > 3]
    for _ in range(r.randrange(3)):
        if words and donor_words:
            words[r.randrange(len(words))] = r.choice(donor_words)
    if attrs and r.random() < 0.5:
        words.insert(r.randrange(len(words) + 1), r.choice(attrs).title())
    if r.random() < 0.35:
        words.append(f"{r.choice(_DIGITS[10:])}{r.choice(_DIGITS[10:])}-{r.randrange(100, 9999)}")
    return " ".join(words)


def _sentences(text: Any) -> list[str]:
    return [s for s in _SENTENCE.split(str(text or "")) if s]


def _bullets(product: dict) -> list[str]:
    raw = product.get("small_description")
    return [b for b in (raw if isinstance(raw, list) else [raw]) if isinstance(b, str)]


def _options(base: dict, donor: dict, pools: Pools, r: random.Random) -> Any:
    source = base.get("customization_options") or (donor.get("customization_options") if r.random() < 0.3 else None)
    if not source:
        return source if source is not None else ""
    out = {}
    for name, contents in source.items():
        if contents is None:
            out[name] = None
            continue
        keep = [c for c in contents if r.random() < 0.75] or contents[:1]
        pool = pools.option_values.get(name.lower(), [])
        extra = r.sample(pool, min(len(pool), r.randrange(4)))
        values, seen = [], set()
        for c in keep + extra:
            if c["value"] not in seen:
                seen.add(c["value"])
                values.append(c)
        out[name] = values
    return out


def _pricing(base: dict, r: random.Random) -> str:
    prices = [float(x) for x in re.findall(r"\$([\d.]+)", str(base.get("pricing") or "").replace(",", ""))
              if x.replace(".", "", 1).isdigit()]
    if not prices:
        return ""
    factor = math.exp(r.gauss(0.0, 0.4))
    return "".join(f"${max(0.5, p * factor):.2f}" for p in prices[:2])


def make_product(i: int, seed: int, pools: Pools) -> tuple[dict, dict]:
    """Raw product ``i`` and its ``items_ins_v2`` entry (deterministic in ``(i, seed)``)."""
    r = random.Random(seed * 10_000_019 + i)
    base = pools.bases[r.randrange(len(pools.bases))]
    donor = r.choice(pools.by_category[base.get("category") or ""])
    asin = synthetic_asin(i, seed)
    attrs = [a for a in pools.base_attrs.get(base["asin"], []) if r.random() < 0.8]
    attrs += r.sample(pools.attr_pool, r.randrange(3))
    attrs = list(dict.fromkeys(attrs))
    brand = r.choice(pools.brands) if pools.brands else "Generic"
    sentences = _sentences(base.get("full_description")) + _sentences(donor.get("full_description"))
    description = " ".join(s for s in sentences if r.random() < 0.6) or (sentences[0] if sentences else "")
    bullets = [b for b in _bullets(base) + _bullets(donor) if b.strip()]
    bullets = r.sample(bullets, min(len(bullets), max(1, len(_bullets(base)))))
    if attrs:
        bullets.append(f"{r.choice(attrs).capitalize()} ")
    product = dict(base)
    product.update(
        name=_title(base, donor, attrs, brand, r), brand=f"Brand: {brand}", asin=asin,
        full_description=description, small_description=bullets, pricing=_pricing(base, r),
        customization_options=_options(base, donor, pools, r),
        product_information={**(base.get("product_information") or {}), "ASIN": asin},
    )
    entry: dict[str, Any] = {"attributes": attrs}
    if attrs and r.random() < INSTRUCTION_FRAC:
        chosen = r.sample(attrs, min(len(attrs), 1 + r.randrange(3)))
        leaf = str(base.get("product_category") or base.get("query") or "item").split("\u203a")[-1].strip().lower()
        cut = r.randrange(len(chosen) + 1)
        text = "Find me " + (", ".join(chosen[:cut]) + " " if cut else "") + leaf
        entry.update(instruction=text + (" with " + ", ".join(chosen[cut:]) if chosen[cut:] else ""),
                     instruction_attributes=chosen)
    return product, entry


def human_instruction(product: dict, entry: dict, pools: Pools, r: random.Random) -> dict:
    """One human-style instruction for ``product`` (items_human_ins.json entry)."""
    opener = r.choices([o for o, _ in pools.openers], weights=[c for _, c in pools.openers])[0]
    kind = str(product.get("query") or "item").lower() if r.random() < 0.5 else \
        str(product.get("product_category") or "item").split("\u203a")[-1].strip().lower()
    attrs = entry["attributes"] or [r.choice(pools.attr_pool)]
    chosen = r.sample(attrs, min(len(attrs), 1 + r.randrange(2)))
    options = []
    for name, contents in (product.get("customization_options") or {}).items():
        if contents and r.random() < 0.6:
            options.append((name.lower(), r.choice(contents)["value"].strip().replace("/", " | ").lower()))
    parts = [f"{opener} {kind} that is {' and '.join(chosen)}"]
    for name, value in options[:2]:
        parts.append(f"in {value} {name}" if name == "color" else f"{name} {value}")
    return {"asin": product["asin"], "instruction": ", ".join(parts) + ".",
            "instruction_attributes": chosen, "instruction_options": [v for _, v in options[:2]]}


def _check_out(out: Path, names: Any) -> None:
    """Refuse an output folder that is a file, or that holds WebShop files without our ``MARKER``."""
    if any(p.exists() and not p.is_dir() for p in (out, *out.parents)):
        raise ValueError(f"output folder {out} is a file or lies under one; choose a folder")
    theirs = sorted(n for n in names if (out / n).exists())
    if theirs and not (out / MARKER).exists():
        raise ValueError(f"{out} holds WebShop files this generator did not write ({', '.join(theirs)}; no "
                         f"{MARKER}); refusing to overwrite them: choose a new or empty output folder")


def generate(out: Path, n_products: int, *, seed: int = 0, human_goals: int = HUMAN_GOALS,
             src: Path | None = None, progress: bool = False) -> dict[str, Path]:
    """Write the three files into ``out`` (each through a temp name, renamed when complete).

    Raises:
        ValueError: ``n_products`` < 1 or ``human_goals`` < 0; ``out`` is a file (or under one), or
            holds WebShop files this generator did not write (real data is never overwritten).
    """
    if n_products < 1 or human_goals < 0:
        raise ValueError(f"need n_products >= 1 and human_goals >= 0, got {n_products}, {human_goals}")
    names = {"products": "items_shuffle.json", "attributes": "items_ins_v2.json", "human": "items_human_ins.json"}
    _check_out(out, names.values())
    pools = Pools(src or default_data_dir())
    out.mkdir(parents=True, exist_ok=True)
    pick = random.Random(f"human-{seed}")
    human_rows = Counter(pick.randrange(n_products) for _ in range(human_goals))
    human: dict[str, list[dict]] = {}
    tmp = {k: out / f".{v}.tmp" for k, v in names.items()}
    t0 = time.perf_counter()
    with open(tmp["products"], "w", encoding="utf-8") as fp, open(tmp["attributes"], "w", encoding="utf-8") as fa:
        fp.write("[")
        fa.write("{")
        for i in range(n_products):
            product, entry = make_product(i, seed, pools)
            sep = ", " if i else ""
            fp.write(sep + json.dumps(product))
            fa.write(sep + json.dumps(product["asin"]) + ": " + json.dumps(entry))
            if i in human_rows:
                r = random.Random(f"human-{seed}-{i}")
                human[product["asin"]] = [human_instruction(product, entry, pools, r) for _ in range(human_rows[i])]
            if progress and (i + 1) % 100_000 == 0:
                print(f"  {i + 1:,} products ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        fp.write("]")
        fa.write("}")
    with open(tmp["human"], "w", encoding="utf-8") as fh:
        json.dump(human, fh)
    for key, name in names.items():
        os.replace(tmp[key], out / name)
    (out / MARKER).write_text(json.dumps(describe(n_products, seed, human_goals)))
    return {k: out / v for k, v in names.items()}


def describe(n_products: int, seed: int, human_goals: int) -> dict[str, Any]:
    """What ``synth.json`` records about a generated folder (to reuse it instead of generating again)."""
    return {"generator": GENERATOR_VERSION, "products": n_products, "seed": seed, "human_goals": human_goals}


def default_out(n_products: int, seed: int) -> Path:
    """Scratch folder for a generated catalog: ``$PROGPO_SCRATCH`` or ``~/.cache/progpo/webshop_synth``."""
    root = Path(os.environ.get("PROGPO_SCRATCH") or Path.home() / ".cache" / "progpo" / "webshop_synth")
    return root.expanduser() / f"n{n_products}-seed{seed}"


def main(argv: list[str] | None = None) -> int:
    """CLI: generate and print the files written."""
    p = argparse.ArgumentParser(prog="python -m envs.webshop_server.synth", description=__doc__.split("\n")[0])
    p.add_argument("--products", type=int, default=FULL_PRODUCTS, help=f"catalog size (default {FULL_PRODUCTS:,})")
    p.add_argument("--human-goals", type=int, default=HUMAN_GOALS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output folder (default: $PROGPO_SCRATCH or ~/.cache/progpo/webshop_synth/nN-seedS)")
    p.add_argument("--src", default=None, help="real WebShop data to derive from (default: $PROGPO_DATA/webshop or ../shared/data/webshop)")
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else default_out(args.products, args.seed)
    t0 = time.perf_counter()
    try:
        files = generate(out, args.products, seed=args.seed, human_goals=args.human_goals,
                         src=Path(args.src) if args.src else None, progress=True)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    for path in files.values():
        print(f"{path}  {path.stat().st_size / 2**20:,.1f} MiB")
    print(f"{args.products:,} products in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
