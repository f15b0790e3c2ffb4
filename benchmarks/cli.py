"""One dispatcher for ``python -m benchmarks NAME`` and ``python -m research NAME``, and the parser of a bench's
settings.

Each command module exposes ``main(argv: list[str]) -> int``; ``--help`` after NAME lists its own flags. A bench's
flags are its settings dataclass (help beside each field, the dataclass the only source of defaults), nesting the
trainer's settings sections where it sets them (``--rollout.batch_size`` is ``RolloutSettings.batch_size``), and
parsed by the one flag generator of every CLI (:mod:`progpo.run.flags`): :func:`settings_parser`, :func:`parse`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, TypeVar

from progpo.run import flags

T = TypeVar("T")


def dispatch(prog: str, commands: dict[str, tuple[str, str]], argv: list[str] | None = None) -> int:
    """Run ``commands[argv[0]]``'s ``main(argv[1:])``.

    ``commands``: name -> (module, one-line description). Returns the command's exit code; 0 after
    printing the list of names for no name or ``--help``; 2 with that list on stderr for an unknown name; 2 with
    one line for a file a flag names that is not there (a model, a data folder: a traceback after the setup).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        lines = [f"  {name:<12} {desc}" for name, (_, desc) in commands.items()]
        msg = f"usage: python -m {prog} NAME [ARGS...]\n\ncommands:\n" + "\n".join(lines)
        if argv and argv[0] not in ("-h", "--help"):
            sys.stderr.write(f"unknown {prog} command {argv[0]!r}\n{msg}\n")
            return 2
        sys.stdout.write(msg + "\n")
        return 0
    module = importlib.import_module(commands[argv[0]][0])
    try:
        return int(module.main(argv[1:]) or 0)
    except FileNotFoundError as exc:  # every such message of the project names the flag and the path
        sys.stderr.write(f"python -m {prog} {argv[0]}: error: {exc}\n")
        return 2


def settings_parser(cls: type, prog: str, description: str, **kwargs: Any) -> argparse.ArgumentParser:
    """The parser of settings dataclass ``cls``: one flag per leaf field (:func:`progpo.run.flags.add_flags`);
    ``kwargs`` go to ``argparse.ArgumentParser`` (a ``formatter_class``)."""
    p = argparse.ArgumentParser(prog=prog, description=description, **kwargs)
    flags.add_flags(p, cls)
    return p


def parse(cls: type[T], parser: argparse.ArgumentParser, argv: list[str] | None) -> T:
    """``argv`` as an instance of ``cls`` (``parser`` from :func:`settings_parser`).

    A value its type or choices reject, or one the dataclass refuses (its ``__post_init__``, a number outside
    its declared range), exits 2 with argparse's usage and one line naming the flag, before any work.
    """
    values = parser.parse_args(argv)
    try:
        return flags.build(cls, values)
    except ValueError as exc:
        parser.error(str(exc))
