"""Import shims: importable ``flash_attn`` and ``vllm`` modules where the real packages are absent.

So that OpenRLHF 0.11.2 imports on a machine without the GPU stack (``train_ray --help`` on a laptop,
the tests, ``--rollout.backend hf``). ``flash_attn.bert_padding`` gets real CPU implementations
(transformers' pure-torch padding helpers, einops' ``rearrange``); ``vllm`` gets a real
``SamplingParams`` data class, ``TokensPrompt`` and ``random_uuid``. Everything else in them raises
:class:`NeedsGPUStack` when called (vLLM's engine, flash-attn's ring all-gather), so no fake
computation can run. A real installed package is never shadowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

SHIM_ATTR = "__progpo_cpu_shim__"
"""Attribute set on every module this file puts into ``sys.modules``."""


class NeedsGPUStack(RuntimeError):
    """Code reached a part of flash-attn / vLLM that has no CPU implementation here."""


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
    stop_token_ids: list | None = None
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
    """``vllm`` with the names OpenRLHF imports; its engine classes raise (see :mod:`progpo.openrlhf.cpu.engine`)."""
    why = "on CPU the generation engine is progpo.openrlhf.cpu.engine.CPURolloutActor"
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
