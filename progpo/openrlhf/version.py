"""The one OpenRLHF release this package extends, and the check that it is the one installed."""

from __future__ import annotations

import importlib.metadata

OPENRLHF_VERSION = "0.11.2"
"""The one OpenRLHF release whose private seams this package overrides."""


def check_openrlhf_version() -> None:
    """Raise RuntimeError unless the installed openrlhf is exactly :data:`OPENRLHF_VERSION`."""
    try:
        found = importlib.metadata.version("openrlhf")
    except importlib.metadata.PackageNotFoundError:
        found = "not installed"
    if found != OPENRLHF_VERSION:
        raise RuntimeError(
            f"progpo's OpenRLHF extension needs openrlhf=={OPENRLHF_VERSION} (found {found}); "
            f"install it with: pip install --no-deps openrlhf=={OPENRLHF_VERSION}"
        )
