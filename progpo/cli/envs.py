"""``python -m progpo.cli.envs list|get``: the registered environments and the facts of their specs.

``list`` prints every registered env id, one a line. ``get NAME FIELD...`` prints the value of each
asked field of NAME's spec (:class:`progpo.envs.spec.EnvSpec`: ``max_steps``, ``eval_split``,
``train_split``, ``splits``, ``pool``, ``service``, ...), one a line, in the order asked: a tuple as its
items joined by spaces, None as an empty line, a bool as ``true``/``false``. The launch scripts
(``examples/scripts/lib/train_args.sh``) read an env's step limit, eval split, pool and service from here,
so that these facts are written once, in the env's ``register(...)`` call::

    $ python -m progpo.cli.envs get alfworld max_steps eval_split
    50
    valid_unseen

An unknown env or field: one line on stderr naming it and what is known, exit 2. Scripts pass the name after
``--`` (``get -- "$ENV" max_steps``), so that a name beginning with ``-`` is read as a name, not as an option.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from progpo.envs import EnvSpec, env_ids, spec

FIELDS: tuple[str, ...] = (*(f.name for f in dataclasses.fields(EnvSpec)), "train_split")
"""What ``get`` can print: every :class:`~progpo.envs.spec.EnvSpec` field, and its ``train_split``."""


def field_text(value: Any) -> str:
    """One spec value as ``get`` prints it: a tuple's items joined by spaces, None as ``""``, a bool as
    ``true``/``false``, anything else as ``str``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return " ".join(field_text(v) for v in value)
    return str(value)


def get(name: str, fields: list[str]) -> list[str]:
    """The printed lines of ``get NAME FIELD...``.

    Raises:
        ValueError: unknown env (names the registered ones) or field (names the known ones).
    """
    env_spec = spec(name)
    unknown = [f for f in fields if f not in FIELDS]
    if unknown:
        raise ValueError(f"unknown spec field(s) {unknown}; known: {list(FIELDS)}")
    return [field_text(getattr(env_spec, f)) for f in fields]


def main(argv: list[str] | None = None) -> int:
    """CLI entry point. Exit codes: 0 printed, 2 an unknown env or field (one line on stderr)."""
    p = argparse.ArgumentParser(prog="python -m progpo.cli.envs", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="print every registered env id")
    g = sub.add_parser("get", help="print fields of one env's spec, one a line")
    g.add_argument("name", help="registered env id")
    g.add_argument("fields", nargs="+", metavar="FIELD", help=f"spec field: {', '.join(FIELDS)}")
    args = p.parse_args(argv)
    if args.cmd == "list":
        print("\n".join(env_ids()))
        return 0
    try:
        lines = get(args.name, args.fields)
    except ValueError as exc:
        sys.stderr.write(f"progpo.cli.envs: {exc}\n")
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
