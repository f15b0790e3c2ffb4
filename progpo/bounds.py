"""The declared range of a number setting: one field metadata entry, read by every check of it.

A float field of a settings dataclass declares its range beside its default, in interval notation, with
:func:`number` (which is ``field(default=..., metadata={"range": ...})``)::

    lr: float = number(1e-6, "> 0")
    lr_warmup_ratio: float = number(0.0, "[0, 1]")

Notation: ``> a``, ``>= a``, ``< b``, ``<= b``, or an interval ``[a, b]`` / ``(a, b]`` / ``[a, b)`` / ``(a, b)``.
A float field with no ``range`` takes any finite number. NaN and +-inf are refused by every range: a
setting is a finite number (a learning rate of inf starts a run that trains on NaN losses).

The flag generator (:mod:`progpo.run.flags`) checks every float field of every settings dataclass against
this range on every CLI; a dataclass checks itself with :func:`check_fields` in its ``__post_init__``, so a
setting built in code is held to the same range. This module imports nothing of the package (any layer may
declare and check a range, ``progpo.advantages`` included).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Callable
from typing import Any

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ONE_SIDE = re.compile(rf"^(>=|>|<=|<)\s*({_NUMBER})$")
_INTERVAL = re.compile(rf"^([\[(])\s*({_NUMBER})\s*,\s*({_NUMBER})\s*([\])])$")


@dataclasses.dataclass(frozen=True)
class Range:
    """A set of finite numbers: ``low < x`` (``low <= x`` when ``low_closed``) and ``x < high`` (or ``<=``).

    Attributes:
        low, high: the bounds (-inf / inf: none on that side).
        low_closed, high_closed: whether the bound itself belongs to the range.
        text: the declaration as written (``"[0, 1]"``; ``""`` for any finite number), used in messages.
    """

    low: float = -math.inf
    high: float = math.inf
    low_closed: bool = False
    high_closed: bool = False
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> Range:
        """The range of a declaration (``"> 0"``, ``"[0, 1)"``; module docstring).

        Raises:
            ValueError: ``text`` is no range in that notation, or an empty one.
        """
        text = " ".join(str(text).split())
        if m := _ONE_SIDE.match(text):
            op, bound = m.group(1), float(m.group(2))
            out = (cls(low=bound, low_closed=op == ">=", text=text) if op.startswith(">")
                   else cls(high=bound, high_closed=op == "<=", text=text))
        elif m := _INTERVAL.match(text):
            out = cls(float(m.group(2)), float(m.group(3)), m.group(1) == "[", m.group(4) == "]", text)
        else:
            raise ValueError(f"range {text!r} is not one of '> a', '>= a', '< b', '<= b', '[a, b]', '(a, b)'")
        if not (out.low < out.high or (out.low == out.high and out.low_closed and out.high_closed)):
            raise ValueError(f"range {text!r} holds no number")
        return out

    def __contains__(self, value: float) -> bool:
        """Whether ``value`` is a finite number in the range."""
        if not math.isfinite(value):
            return False
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return above and below

    def rule(self, value: float) -> str:
        """What a value outside the range must be: ``"must be > 0"``, or ``"must be a finite number > 0"`` for
        NaN and +-inf (whose comparisons say nothing)."""
        where = self.text if self.text.startswith(("<", ">")) else f"in {self.text}" if self.text else ""
        if math.isfinite(value):
            return f"must be {where}".rstrip()
        return f"must be a finite number {where}".rstrip()


ANY_FINITE = Range()
"""The range of a float field that declares none."""


def number(default: Any, range_text: str) -> Any:
    """A dataclass field holding ``default`` whose declared range is ``range_text`` (``"> 0"``, ``"[0, 1)"``).

    Raises:
        ValueError: ``range_text`` does not parse (at import, where the field is declared).
    """
    Range.parse(range_text)
    return dataclasses.field(default=default, metadata={"range": range_text})


def _number_kind(hint: Any) -> str | None:
    """``"float"`` for ``float`` / ``float | None``, ``"floats"`` for a tuple of floats, else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else None
    if hint is float:
        return "float"
    if typing.get_origin(hint) is tuple and {a for a in typing.get_args(hint) if a is not Ellipsis} == {float}:
        return "floats"
    return None


def declared(f: dataclasses.Field, hint: Any) -> Range | None:
    """The range of field ``f`` whose resolved type is ``hint``: its ``metadata["range"]``, :data:`ANY_FINITE`
    for a float field that declares none, None for a field that holds no float.

    Raises:
        TypeError: a ``range`` on a field that holds no float, or one that does not parse.
    """
    text = f.metadata.get("range")
    if _number_kind(hint) is None:
        if text is not None:
            raise TypeError(f"{f.name}: a range is declared on a field of type {hint!r}, which holds no float")
        return None
    if text is None:
        return ANY_FINITE
    try:
        return Range.parse(text)
    except ValueError as exc:
        raise TypeError(f"{f.name}: {exc}") from None


def refusal(value: Any, rng: Range) -> str | None:
    """None when ``value`` (a number, a tuple of numbers, or None = unset) lies in ``rng``; else the words
    ``"must be in [0, 1), got 0.9 1.5"`` (a tuple shown as its items, as its flag takes them)."""
    if value is None:
        return None
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    shown = " ".join(map(str, items))
    for v in items:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"must be a number, got {shown}"
        if v not in rng:
            return f"{rng.rule(v)}, got {shown}"
    return None


@functools.lru_cache(maxsize=None)
def ranges(cls: type) -> tuple[tuple[str, Range], ...]:
    """``(field name, range)`` of every float field of dataclass ``cls`` (:func:`declared`)."""
    hints = typing.get_type_hints(cls)
    found = ((f.name, declared(f, hints[f.name])) for f in dataclasses.fields(cls))
    return tuple((n, r) for n, r in found if r is not None)


def check_fields(obj: Any, name: Callable[[str], str]) -> None:
    """Check every float field of the dataclass instance ``obj`` against its declared range.

    Args:
        obj: a settings dataclass instance. name: field name -> how the message names it (its flag,
            ``lambda n: f"--actor.adam.{n}"``, or ``AdvantageConfig.<n>``).

    Raises:
        ValueError: ``"<name> must be > 0, got inf"`` for the first field outside its range.
    """
    for field_name, rng in ranges(type(obj)):
        words = refusal(getattr(obj, field_name), rng)
        if words is not None:
            raise ValueError(f"{name(field_name)} {words}")
