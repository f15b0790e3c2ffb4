"""Everything OpenRLHF 0.11.2 needs to run on CPU, in one place (``python -m progpo.cli.train_ray --device cpu``).

OpenRLHF is written for CUDA: it imports ``flash_attn`` and ``vllm`` at module level, calls
``torch.cuda`` for devices, builds a ``cuda`` device mesh, syncs weights over NCCL and asks Ray for
GPU bundles. The installed OpenRLHF is never edited; instead this module puts a CPU stand-in next
to each of those seams, for exactly :data:`OPENRLHF_VERSION` (other versions are refused: the
seams are private). docs/distributed.md lists every item with the OpenRLHF function it stands in
for. Three layers:

* :func:`import_shims` / :func:`install_import_shims` -- importable ``flash_attn`` and ``vllm``
  modules when the real packages are absent, so OpenRLHF imports (``--help`` on a laptop, tests).
  ``flash_attn.bert_padding`` gets real CPU implementations (transformers' pure-torch padding
  helpers, einops' ``rearrange``); ``vllm`` gets a real ``SamplingParams`` data class,
  ``TokensPrompt`` and ``random_uuid``. Everything else in them raises :class:`NeedsGPUStack` when
  called (vLLM's engine, flash-attn's ring all-gather), so no fake computation can run.
* :func:`install` -- the runtime stand-ins of CPU mode, applied in the driver and, through Ray's
  ``worker_process_setup_hook`` (:func:`worker_setup_hook`), in every Ray worker before any actor
  is unpickled: ``torch.cuda`` device calls -> DeepSpeed's CPU accelerator, ``init_device_mesh`` on
  ``cpu``, DeepSpeed's shared-memory comm op off, DeepSpeed's own ``torch_adam`` optimizer switch
  instead of FusedAdam, the replay buffer's target device, and a stateless gloo group for the weight
  sync instead of vLLM's ``StatelessProcessGroup`` + ``PyNcclCommunicator``.
* :func:`launch_patches` -- driver-only, around OpenRLHF's ``train()``: CPU bundles instead of
  GPU bundles in placement groups, CPU slots instead of ``num_gpus`` for its model actors, and
  :func:`progpo.openrlhf.cpu_engine.create_cpu_engines` instead of ``create_vllm_engines``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import os
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

OPENRLHF_VERSION = "0.11.2"
"""The one OpenRLHF release whose private seams this package overrides."""

THREADS_ENV_VAR = "PROGPO_CPU_TORCH_THREADS"
"""torch intra-op threads of every process of a CPU run (``--cpu.torch_threads``)."""

SHIM_ATTR = "__progpo_cpu_shim__"
"""Attribute set on every module this file puts into ``sys.modules``."""


class NeedsGPUStack(RuntimeError):
    """Code reached a part of flash-attn / vLLM that has no CPU implementation here."""


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


def missing_gpu_packages() -> list[str]:
    """Names of the GPU-stack packages (``vllm``, ``flash_attn``) that are not really installed."""
    out = []
    for name in ("vllm", "flash_attn"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, SHIM_ATTR, False):
            out.append(name)
            continue
        try:
            importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            out.append(name)
    return out


# ---------------------------------------------------------------------------------------------
# import shims
# ---------------------------------------------------------------------------------------------


def _raises(name: str, why: str):
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise NeedsGPUStack(f"{name} has no CPU implementation here ({why}); it needs the real package on a GPU node")

    fn.__name__ = name.rsplit(".", 1)[-1]
    fn.__qualname__ = name
    return fn


@dataclasses.dataclass
class SamplingParams:
    """The fields of ``vllm.SamplingParams`` that OpenRLHF's samples generator sets and engines read,
    with vLLM's defaults (including every field of ``progpo.agents.types.VLLM_NEUTRAL_SAMPLING``).

    A plain data class (vLLM's own is a msgspec struct); used only when vLLM is not installed.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    logit_bias: dict | None = None
    allowed_token_ids: list | None = None
    bad_words: list | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    seed: int | None = None
    include_stop_str_in_output: bool = False


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    setattr(mod, SHIM_ATTR, True)
    # A spec without a loader or __file__: importlib.util.find_spec works, and transformers (whose
    # probes run first anyway, see install_import_shims) would see a versionless package.
    mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    return mod


def _index_first_axis(values: Any, indices: Any) -> Any:
    """flash-attn's ``index_first_axis``: ``values[indices]`` along dim 0 (``[N, ...]`` -> ``[len(indices), ...]``)."""
    import torch

    return torch.index_select(values, 0, indices)


def _flash_attn_modules() -> list[types.ModuleType]:
    """``flash_attn`` with the names OpenRLHF's ``models/ring_attn_utils.py`` imports.

    The padding helpers are real: ``unpad_input`` / ``pad_input`` are transformers' pure-torch
    copies of flash-attn's (same signatures and return values), ``rearrange`` is einops' (which
    flash-attn re-exports), and ``index_first_axis`` (rows ``indices`` of an already flattened
    ``[(b s), ...]`` tensor; transformers' ``_index_first_axis`` flattens itself, so it is not a
    drop-in) is ``torch.index_select`` on dim 0. ``all_gather`` (ring attention only) raises.
    """
    from einops import rearrange
    from transformers import modeling_flash_attention_utils as fa_utils

    fa = _module("flash_attn", __version__="0+progpo.cpu")
    fa.bert_padding = _module(
        "flash_attn.bert_padding",
        index_first_axis=_index_first_axis,
        pad_input=fa_utils._pad_input,  # noqa: SLF001 - transformers' copy of flash-attn's helper
        unpad_input=fa_utils._unpad_input,  # noqa: SLF001
        rearrange=rearrange,
    )
    fa.utils = _module("flash_attn.utils")
    fa.utils.distributed = _module(
        "flash_attn.utils.distributed",
        all_gather=_raises("flash_attn.utils.distributed.all_gather", "ring attention is GPU-only"),
    )
    return [fa, fa.bert_padding, fa.utils, fa.utils.distributed]


def _vllm_modules() -> list[types.ModuleType]:
    """``vllm`` with the names OpenRLHF imports; its engine classes raise (see :mod:`cpu_engine`)."""
    why = "on CPU the generation engine is progpo.openrlhf.cpu_engine.CPURolloutActor"
    vl = _module(
        "vllm",
        __version__="0+progpo.cpu",
        SamplingParams=SamplingParams,
        AsyncEngineArgs=_raises("vllm.AsyncEngineArgs", why),
        AsyncLLMEngine=types.SimpleNamespace(from_engine_args=_raises("vllm.AsyncLLMEngine.from_engine_args", why)),
    )
    vl.inputs = _module("vllm.inputs", TokensPrompt=dict)
    vl.utils = _module("vllm.utils", random_uuid=lambda: uuid.uuid4().hex)
    return [vl, vl.inputs, vl.utils]


def install_import_shims() -> list[str]:
    """Put ``flash_attn`` / ``vllm`` shims into ``sys.modules`` where the real package is absent.

    A real installed package is never shadowed. transformers' import-time package probes run
    before any shim exists (it then treats flash-attn as absent, as it is).

    Returns:
        The module names added (empty when both packages are installed or already shimmed).
    """
    import transformers.modeling_utils  # noqa: F401 - runs transformers' package probes first

    added: list[str] = []
    for name, build in (("flash_attn", _flash_attn_modules), ("vllm", _vllm_modules)):
        if name in sys.modules or importlib.util.find_spec(name) is not None:
            continue
        for mod in build():
            sys.modules[mod.__name__] = mod
            added.append(mod.__name__)
    return added


@contextlib.contextmanager
def import_shims() -> Iterator[list[str]]:
    """The import shims inside the block only; modules imported inside keep their references.

    For code that must import OpenRLHF without leaving a fake ``vllm`` visible to later probes
    (``--help``, tests). Yields the names added.
    """
    added = install_import_shims()
    try:
        yield added
    finally:
        for name in added:
            sys.modules.pop(name, None)


# ---------------------------------------------------------------------------------------------
# runtime stand-ins (every process of a CPU run)
# ---------------------------------------------------------------------------------------------


class StatelessGlooGroup:
    """A gloo process group over its own TCP store, outside ``torch.distributed``'s default group.

    CPU stand-in for what OpenRLHF's ``stateless_init_process_group`` returns (vLLM's
    ``StatelessProcessGroup`` + ``PyNcclCommunicator``): rank 0 is DeepSpeed rank 0 of the actor,
    ranks 1.. are engines. Only ``broadcast`` is used (``ActorPPOTrainer.broadcast_to_vllm``).

    Args:
        master_address, master_port: rank 0 serves the TCP store there.
        rank, world_size: this process's rank and the group size.
        timeout_s: rendezvous and collective timeout.
    """

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int,
                 timeout_s: float = 600.0) -> None:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size = rank, world_size
        self._store = dist.TCPStore(master_address, int(master_port), world_size, is_master=rank == 0,
                                    timeout=timeout)
        self._pg = dist.ProcessGroupGloo(dist.PrefixStore("progpo_weight_sync", self._store), rank, world_size,
                                         timeout)

    def broadcast(self, tensor: Any, src: int, stream: Any = None) -> None:
        """In-place broadcast of ``tensor`` from rank ``src`` (``stream`` is accepted and ignored)."""
        self._pg.broadcast(tensor, src).wait()


def stateless_init_process_group(master_address: str, master_port: int, rank: int, world_size: int,
                                 device: Any = None) -> StatelessGlooGroup:
    """Same signature as ``openrlhf.utils.distributed_util.stateless_init_process_group``, over gloo."""
    return StatelessGlooGroup(master_address, master_port, rank, world_size)


def _cuda_stand_ins() -> dict[str, Any]:
    """``torch.cuda`` functions OpenRLHF calls, mapped to DeepSpeed's CPU accelerator.

    ``current_device`` returns the device *name* (``"cpu"``): OpenRLHF uses it as a ``.to()`` target.
    """
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.device_name() != "cpu":
        raise RuntimeError(f"--device cpu, but DeepSpeed picked the {acc.device_name()!r} accelerator")
    return {
        "current_device": acc.current_device_name,
        "set_device": acc.set_device,
        "synchronize": acc.synchronize,
        "empty_cache": acc.empty_cache,
        "current_stream": acc.current_stream,
    }


def _replay_buffer_on_cpu() -> None:
    """``NaiveReplayBuffer.__init__`` builds ``torch.device(f"cuda:{current_device()}")``: keep CPU."""
    import torch
    from openrlhf.trainer.ppo_utils import replay_buffer

    cls = replay_buffer.NaiveReplayBuffer
    if getattr(cls.__init__, SHIM_ATTR, False):
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        saved = torch.cuda.current_device
        torch.cuda.current_device = lambda: 0  # only formatted into the (unused) cuda device name
        try:
            original(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = saved
        self.target_device = torch.device("cpu")

    setattr(__init__, SHIM_ATTR, True)
    cls.__init__ = __init__


def _ds_config_torch_adam() -> None:
    """DeepSpeed builds FusedAdam (a C++ op, ~155 s compile on CPU) for OpenRLHF's ``AdamW`` config;
    DeepSpeed's own ``torch_adam`` switch makes it ``torch.optim.AdamW`` instead."""
    from openrlhf.utils.deepspeed.deepspeed import DeepspeedStrategy

    original = DeepspeedStrategy.get_ds_train_config
    if getattr(original, SHIM_ATTR, False):
        return

    @functools.wraps(original)
    def get_ds_train_config(self, *args: Any, **kwargs: Any) -> dict:
        cfg = original(self, *args, **kwargs)
        opt = cfg.get("optimizer")
        if opt and opt.get("type", "").lower() in ("adam", "adamw"):
            opt["params"] = {**opt.get("params", {}), "torch_adam": True}
        return cfg

    setattr(get_ds_train_config, SHIM_ATTR, True)
    DeepspeedStrategy.get_ds_train_config = get_ds_train_config


def _device_mesh_on_cpu() -> None:
    """``DeepspeedStrategy.setup_distributed`` calls ``init_device_mesh("cuda", ...)``: use ``cpu``."""
    from openrlhf.utils.deepspeed import deepspeed as ds_module

    original = ds_module.init_device_mesh
    if getattr(original, SHIM_ATTR, False):
        return

    @functools.wraps(original)
    def init_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        return original("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    setattr(init_device_mesh, SHIM_ATTR, True)
    ds_module.init_device_mesh = init_device_mesh


def _zero3_loading_on_this_transformers() -> None:
    """OpenRLHF's ``_patch_zero3_weight_mapping`` (its issue 1232) wraps transformers'
    ``_apply_weight_conversions_to_state_dict`` as the dict-returning function of transformers 5.15.
    From transformers 5.2x (this project's CPU stack) that function is a generator that already
    matches keys against the model, and the wrapper breaks every ZeRO-3 load ("'generator' object
    has no attribute 'update'"). Mark it as patched so OpenRLHF leaves it alone there."""
    import inspect

    from transformers.integrations import deepspeed as hf_deepspeed

    fn = getattr(hf_deepspeed, "_apply_weight_conversions_to_state_dict", None)
    if fn is not None and inspect.isgeneratorfunction(fn):
        fn._openrlhf_patched = True


def _eager_entropy() -> None:
    """``openrlhf.models.utils.compute_entropy`` is ``@torch.compile``d; on CPU inductor compiles C++
    for every new shape. Use the same function uncompiled."""
    from openrlhf.models import actor, utils

    compiled = utils.compute_entropy
    eager = getattr(compiled, "_torchdynamo_orig_callable", None)
    if eager is not None:
        utils.compute_entropy = eager
        actor.compute_entropy = eager


_INSTALLED = False


def install() -> None:
    """Apply every CPU stand-in in this process (idempotent). See the module docstring.

    Raises:
        RuntimeError: another OpenRLHF version is installed, or a CUDA device is visible to
            DeepSpeed (CPU mode must not half-run on a GPU).
    """
    global _INSTALLED
    if _INSTALLED:
        return
    check_openrlhf_version()
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/progpo/torch_extensions"))
    install_import_shims()
    import deepspeed
    import torch

    # DeepSpeed's TorchBackend builds its shared-memory allreduce op (C++, ~75 s) on CPU; gloo's
    # own allreduce is used instead.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    threads = os.environ.get(THREADS_ENV_VAR)
    if threads:  # Ray sets OMP_NUM_THREADS to an actor's CPU slots (1): let the busy process use the cores
        torch.set_num_threads(int(threads))
    for name, fn in _cuda_stand_ins().items():
        setattr(torch.cuda, name, fn)
    _device_mesh_on_cpu()
    _ds_config_torch_adam()
    _replay_buffer_on_cpu()
    _zero3_loading_on_this_transformers()
    _eager_entropy()
    from openrlhf.trainer.ray import ppo_actor

    ppo_actor.stateless_init_process_group = stateless_init_process_group
    _INSTALLED = True
    logger.info("OpenRLHF %s CPU stand-ins installed (pid %d)", OPENRLHF_VERSION, os.getpid())


def worker_setup_hook() -> None:
    """Ray ``worker_process_setup_hook`` of a CPU run: :func:`install` in every worker process."""
    install()


# ---------------------------------------------------------------------------------------------
# driver-only launch patches
# ---------------------------------------------------------------------------------------------


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
def launch_patches(policy_actor_class: Any, engine_kwargs: dict[str, Any]) -> Iterator[None]:
    """Driver-side stand-ins around OpenRLHF's ``train()`` (``cli/train_ppo_ray.py``) in CPU mode.

    Args:
        policy_actor_class: the policy actor Ray class to use (ours, subclassing OpenRLHF's).
        engine_kwargs: extra keyword arguments of :func:`progpo.openrlhf.cpu_engine.create_cpu_engines`
            (``dtype``, ``max_batch_size``).
    """
    from openrlhf.trainer import ray as openrlhf_ray
    from openrlhf.trainer.ray import launcher, ppo_actor, ppo_critic

    from progpo.openrlhf.cpu_engine import create_cpu_engines

    install()
    ray_pg = importlib.import_module("ray.util.placement_group")  # the module (ray.util re-exports the function)
    engines = functools.partial(create_cpu_engines, **engine_kwargs)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(ray_pg, "placement_group", cpu_placement_group))
        stack.enter_context(patched(launcher, "placement_group", cpu_placement_group))
        stack.enter_context(patched(openrlhf_ray, "create_vllm_engines", engines))
        stack.enter_context(patched(ppo_actor, "PolicyModelActor", CPUActorClass(policy_actor_class)))
        for mod, name in ((launcher, "ReferenceModelActor"), (launcher, "RewardModelActor"),
                          (ppo_critic, "CriticModelActor")):
            stack.enter_context(patched(mod, name, CPUActorClass(getattr(mod, name))))
        yield
