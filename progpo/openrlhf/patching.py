"""Scoped attribute replacement, the one way this package changes OpenRLHF's behaviour at run time."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """``obj.name = value`` inside the block, the old value restored afterwards."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def patched_item(mapping: Any, key: str, value: Any) -> Iterator[None]:
    """``mapping[key] = value`` inside the block (``mapping`` must hold ``key``), the old value restored afterwards.

    For a function's ``__globals__``: where Ray shipped a class by value (cloudpickle), its methods resolve names
    in a copy of their module's namespace, which patching the module does not reach.
    """
    old = mapping[key]
    mapping[key] = value
    try:
        yield
    finally:
        mapping[key] = old
