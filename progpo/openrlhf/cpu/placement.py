"""Ray placement on CPU: GPU bundles become CPU slots, ``num_gpus`` becomes CPU slots (driver side)."""

from __future__ import annotations

import importlib
from typing import Any

def cpu_bundles(bundles: list[dict[str, float]]) -> list[dict[str, float]]:
    """Placement-group bundles with their ``GPU`` entries dropped (each keeps its CPU slot)."""
    out = []
    for b in bundles:
        cpu = {k: v for k, v in b.items() if k != "GPU"}
        cpu.setdefault("CPU", 1)
        out.append(cpu)
    return out


def cpu_placement_group(bundles: list[dict[str, float]], *args: Any, **kwargs: Any) -> Any:
    """``ray.util.placement_group.placement_group`` with :func:`cpu_bundles`."""
    return _RAY_PLACEMENT_GROUP(cpu_bundles(bundles), *args, **kwargs)


_RAY_PLACEMENT_GROUP = importlib.import_module("ray.util.placement_group").placement_group  # before any patch


class CPUActorClass:
    """A Ray actor class whose ``.options(num_gpus=x)`` asks for CPU slots only.

    OpenRLHF's ``RayActorGroup`` calls ``options(num_cpus=x, num_gpus=x, ...)`` with ``x`` = 1 (a
    whole GPU) or 0.2 (colocated); on CPU that ``x`` stays the CPU slot and ``num_gpus`` becomes 0.
    """

    def __init__(self, actor_class: Any) -> None:
        self._cls = actor_class

    def options(self, **kwargs: Any) -> Any:
        gpus = kwargs.pop("num_gpus", 0) or 0
        kwargs.setdefault("num_cpus", gpus or 1)
        return self._cls.options(num_gpus=0, **kwargs)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.options().remote(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_cls":  # unpickling looks these up before _cls exists
            raise AttributeError(name)
        return getattr(self._cls, name)
