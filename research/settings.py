"""The lab commands' settings: each command is one frozen dataclass, parsed by the product's flag generator.

A lab command declares its flags as a dataclass the way ``train`` does (:mod:`progpo.run.flags`): one field per
setting with its help beside it, the dataclass the only source of defaults, float ranges declared with
:func:`progpo.bounds.number` (checked by the generator). Where a lab command sets a training setting (the run's
length, the group size, the tasks per iteration, a seed, the step limit ...) it nests the trainer's own settings
dataclass under the trainer's prefix (``--train.num_iterations``, ``--rollout.n_samples_per_prompt``), exposing
only the fields it uses, so the flag, its type and its checks are the trainer's. Counts are checked in the
command's ``__post_init__`` through :func:`check_counts`; every error names the flag (a
:class:`~progpo.run.flags.FlagError`, a ``ValueError``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from progpo.run import flags
from progpo.run.settings import RolloutSettings, TrainSettings

T = TypeVar("T")


@dataclass(frozen=True)
class LabTrainSettings(TrainSettings):
    """The trainer's ``--train.*`` settings as a lab run takes them: a lab run always has a fixed length."""

    num_iterations: int = 100
    """rollout + update iterations per run, each --rollout.batch_size tasks x --rollout.n_samples_per_prompt episodes then the update"""


def train_section(*only: str, **values: Any) -> Any:
    """A ``train: LabTrainSettings`` field exposing ``only`` (``"num_iterations"``, ``"seed"``) with the lab's
    defaults ``values`` (``num_iterations=41``)."""
    return field(default_factory=lambda: LabTrainSettings(**values), metadata={"flags": only})


def rollout_section(*only: str, **values: Any) -> Any:
    """A ``rollout: RolloutSettings`` field exposing ``only`` (``"batch_size"``, ``"n_samples_per_prompt"``) with
    the lab's defaults ``values``."""
    return field(default_factory=lambda: RolloutSettings(**values), metadata={"flags": only})


def max_workers() -> int:
    """The most ``--workers`` a lab command takes: 4 per CPU of this machine, at least 8 (each worker is a forked
    process, all started at once: ``--workers 100000`` forked until the machine stalled)."""
    return max(8, 4 * (os.cpu_count() or 1))


def check_counts(obj: Any, lows: Mapping[str, int]) -> None:
    """Refuse an integer field of ``obj`` below its least value: ``lows`` maps field name -> least value; a
    ``workers`` field is also held to :func:`max_workers`.

    Raises:
        ValueError: ``--name must be >= low, got value`` for the first such field (its flag is the field name).
    """
    for name, low in lows.items():
        value = getattr(obj, name)
        if value is None or value < low:
            raise ValueError(f"--{name} must be >= {low}, got {value}")
        if name == "workers" and value > max_workers():
            raise ValueError(f"--workers must be <= {max_workers()} (4 per CPU of this machine, at least 8), "
                             f"got {value}")


def build_parser(cls: type, prog: str, description: str) -> argparse.ArgumentParser:
    """The parser of lab command ``cls``: one flag per leaf setting (:func:`progpo.run.flags.add_flags`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    flags.add_flags(parser, cls)
    return parser


def parse(cls: type[T], argv: Sequence[str], prog: str, description: str) -> T:
    """``argv`` as an instance of the lab command ``cls`` (argparse's exit 2 on an unknown flag or a value of the
    wrong type; :class:`~progpo.run.flags.FlagError` on a value the settings refuse)."""
    return flags.build(cls, build_parser(cls, prog, description).parse_args(list(argv)))


def flat(settings: Any, **names: str) -> argparse.Namespace:
    """The parsed settings as the flat namespace a lab run reads: every top-level leaf under its own name, and
    ``names`` (``iterations="train.num_iterations"``) for the nested ones; ``settings`` holds the dataclass."""
    out = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
           if not dataclasses.is_dataclass(getattr(settings, f.name))}
    for name, path in names.items():
        value = settings
        for part in path.split("."):
            value = getattr(value, part)
        out[name] = value
    return argparse.Namespace(settings=settings, **out)
