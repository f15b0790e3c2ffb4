"""Runtime stand-ins of CPU mode, applied in every process of a CPU run (driver and Ray workers).

:func:`install` (through Ray's ``worker_process_setup_hook``, :func:`worker_setup_hook`, in every
worker before any actor is unpickled): ``torch.cuda`` device calls -> DeepSpeed's CPU accelerator,
``init_device_mesh`` on ``cpu``, DeepSpeed's shared-memory comm op off, DeepSpeed's own
``torch_adam`` optimizer switch instead of FusedAdam, the replay buffer's target device, and a
stateless gloo group for the weight sync instead of vLLM's ``StatelessProcessGroup`` +
``PyNcclCommunicator``.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
from typing import Any

from progpo.openrlhf.cpu.shims import SHIM_ATTR, install_import_shims
from progpo.openrlhf.version import OPENRLHF_VERSION, check_openrlhf_version

logger = logging.getLogger(__name__)

THREADS_ENV_VAR = "PROGPO_CPU_TORCH_THREADS"
"""torch intra-op threads of every process of a CPU run (``--cpu.torch_threads``)."""


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
        raise RuntimeError(f"--rollout.backend hf, but DeepSpeed picked the {acc.device_name()!r} accelerator")
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
    """DeepSpeed builds FusedAdam (a C++ op, a slow compile on CPU: docs/distributed.md, "What OpenRLHF needs
    on CPU") for OpenRLHF's ``AdamW`` config; DeepSpeed's own ``torch_adam`` switch makes it
    ``torch.optim.AdamW`` instead."""
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

    # DeepSpeed's TorchBackend builds its shared-memory allreduce op (a slow C++ build, docs/distributed.md,
    # "What OpenRLHF needs on CPU") on CPU; gloo's own allreduce is used instead.
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
