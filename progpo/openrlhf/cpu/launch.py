"""Driver-only launch patches of CPU mode, around OpenRLHF's ``train()``."""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from typing import Any

from progpo.openrlhf.cpu.placement import CPUActorClass, cpu_placement_group
from progpo.openrlhf.patching import patched
from progpo.openrlhf.cpu.runtime import install


@contextlib.contextmanager
def launch_patches(policy_actor_class: Any, engine_kwargs: dict[str, Any]) -> Iterator[None]:
    """Driver-side stand-ins around OpenRLHF's ``train()`` (``cli/train_ppo_ray.py``) in CPU mode.

    On a Ray cluster without GPU resources (a local head) OpenRLHF's GPU requests become CPU slots
    (:mod:`progpo.openrlhf.cpu.placement`). On a cluster whose nodes declare logical GPUs
    (``ray start --num-gpus N`` on CPU machines: :func:`has_gpu_slots`, as
    ``examples/scripts/dry_run_cluster_cpu.sh`` starts it) OpenRLHF's own placement runs unchanged:
    its ``{GPU: 1, CPU: 1}`` bundles, per-node GPU counts and colocation fractions land on those
    slots as on a GPU cluster; only the engines are the CPU engine.

    Args:
        policy_actor_class: the policy actor Ray class to use (ours, subclassing OpenRLHF's).
        engine_kwargs: ``engine`` (``--cpu.engine``: ``vllm`` runs OpenRLHF's own ``create_vllm_engines`` with
            :func:`progpo.openrlhf.cpu.vllm_engine.create_vllm_cpu_engines`; ``hf`` the transformers stand-in
            :func:`progpo.openrlhf.cpu.engine.create_cpu_engines`) and the extra keyword arguments of that function.
    """
    from openrlhf.trainer import ray as openrlhf_ray
    from openrlhf.trainer.ray import launcher, ppo_actor, ppo_critic

    install()
    slots = has_gpu_slots()
    ray_pg = importlib.import_module("ray.util.placement_group")  # the module (ray.util re-exports the function)
    kwargs = dict(engine_kwargs)
    if kwargs.pop("engine", "hf") == "vllm":
        from progpo.openrlhf.cpu.vllm_engine import create_vllm_cpu_engines as create
    else:
        from progpo.openrlhf.cpu.engine import create_cpu_engines as create
    engines = functools.partial(create, **kwargs, gpu_slots=slots)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(openrlhf_ray, "create_vllm_engines", engines))
        if not slots:
            stack.enter_context(patched(ray_pg, "placement_group", cpu_placement_group))
            stack.enter_context(patched(launcher, "placement_group", cpu_placement_group))
            stack.enter_context(patched(ppo_actor, "PolicyModelActor", CPUActorClass(policy_actor_class)))
            for mod, name in ((launcher, "ReferenceModelActor"), (launcher, "RewardModelActor"),
                              (ppo_critic, "CriticModelActor")):
                stack.enter_context(patched(mod, name, CPUActorClass(getattr(mod, name))))
        yield


def has_gpu_slots() -> bool:
    """True when the connected Ray cluster declares GPU resources (logical slots on CPU machines)."""
    import ray

    return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
