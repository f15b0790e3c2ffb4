"""Where the server finds its data when no ``--data-dir`` is given.

The same search order as the training package's ``progpo.paths.data_root`` (a test keeps the two
equal; the server imports no training code, so it carries its own copy of the rule):

1. ``$PROGPO_DATA/webshop``;
2. ``../shared/data/webshop`` next to the checkout that holds this package;
3. ``~/.cache/progpo/data/webshop`` (where ``python -m progpo.cli.data download`` puts it).
"""

from __future__ import annotations

import os
from pathlib import Path

CHECKOUT_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding the ``envs`` package (the project checkout): ``python -m envs.webshop_server`` runs there."""


def default_data_dir() -> Path:
    """The WebShop data folder to read when none is given (see the module docstring).

    Returns:
        The first candidate that exists, else the user cache folder (callers then raise
        ``FileNotFoundError`` naming the file they needed).
    """
    env = os.environ.get("PROGPO_DATA")
    if env:
        return Path(env).expanduser() / "webshop"
    shared = CHECKOUT_ROOT.parent / "shared" / "data"
    if shared.is_dir():
        return shared / "webshop"
    return Path.home() / ".cache" / "progpo" / "data" / "webshop"


def require_path(path: Path, what: str, hint: str = "") -> Path:
    """Return ``path`` if it exists, else raise ``FileNotFoundError`` naming it and what it is for."""
    if not path.exists():
        raise FileNotFoundError(f"{what} not found at {path}" + (f". {hint}" if hint else ""))
    return path
