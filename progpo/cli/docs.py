"""``python -m progpo.cli.docs [--write]``: check (or rewrite) the generated flag tables of docs/training.md and docs/distributed.md.

Each table is built from the CLI's own parser (the settings dataclasses and the help beside each
field), between ``<!-- flags:NAME -->`` and ``<!-- /flags:NAME -->`` markers, so the docs cannot drift
from the flags. Without ``--write`` it exits 1 naming a stale table; ``--write`` rewrites them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from progpo.paths import REPO_ROOT

DOCS = {"train": "docs/training.md", "sft": "docs/training.md", "evaluate": "docs/training.md",
        "train_ray": "docs/distributed.md"}


def tables() -> dict[str, str]:
    """``name -> markdown`` of every generated table."""
    from progpo.cli import evaluate, sft
    from progpo.openrlhf.cpu import import_shims
    from progpo.run.flags import iter_flags, markdown_table
    from progpo.trainer import config

    with import_shims():
        from progpo.cli import train_ray
        from progpo.openrlhf import launch

        ray = train_ray.build_parser()
    ours = ("algo.advantage.estimator", "progpo", *(f.dest for f in iter_flags(launch.RayArgs)))
    return {"train": markdown_table(config.build_parser()), "sft": markdown_table(sft.build_parser()),
            "evaluate": markdown_table(evaluate.build_parser()), "train_ray": markdown_table(ray, only=ours)}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- flags:{name} -->\n)(.*?)(\n<!-- /flags:{name} -->)", re.DOTALL)


def stale(write: bool = False) -> list[str]:
    """Names of the tables whose docs block differs from the parser (rewritten when ``write``)."""
    out = []
    for name, table in tables().items():
        path = REPO_ROOT / DOCS[name]
        text = path.read_text(encoding="utf-8")
        m = _block(name).search(text)
        if m is None:
            raise ValueError(f"{DOCS[name]} has no <!-- flags:{name} --> ... <!-- /flags:{name} --> block")
        if m.group(2) != table:
            out.append(name)
            if write:
                path.write_text(text[:m.start(2)] + table + text[m.end(2):], encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    """Check (default) or rewrite the generated flag tables; exit 1 when one is stale and not written."""
    p = argparse.ArgumentParser(prog="python -m progpo.cli.docs", description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="rewrite stale tables")
    args = p.parse_args(argv)
    names = stale(write=args.write)
    if names and not args.write:
        sys.stderr.write(f"stale flag tables: {names}; run python -m progpo.cli.docs --write\n")
        return 1
    print(f"{'rewrote' if names else 'up to date'}: {names or sorted(DOCS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
