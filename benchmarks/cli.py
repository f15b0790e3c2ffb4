"""One dispatcher for ``python -m benchmarks NAME`` and ``python -m research NAME``.

Each command module exposes ``main(argv: list[str]) -> int``; ``--help`` after NAME lists its own flags.
"""

from __future__ import annotations

import importlib
import sys


def dispatch(prog: str, commands: dict[str, tuple[str, str]], argv: list[str] | None = None) -> int:
    """Run ``commands[argv[0]]``'s ``main(argv[1:])``.

    ``commands``: name -> (module, one-line description). Returns the command's exit code; 0 after
    printing the list of names for no name or ``--help``; 2 with that list on stderr for an unknown name.
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
    return int(module.main(argv[1:]) or 0)
