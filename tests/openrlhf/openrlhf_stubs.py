"""Test-only stand-ins for ``flash_attn`` and ``vllm`` so OpenRLHF 0.11.2 imports on CPU.

OpenRLHF imports ``flash_attn`` at module level (``models/ring_attn_utils.py``) and ``vllm`` in
its samples generator and vLLM engine module; neither installs without CUDA. These stubs are
written by us, define only the names OpenRLHF imports, and raise if anything actually *calls*
into them, so a test can never silently run fake attention or fake generation.

Usage (tests only)::

    with stubbed():
        import progpo.openrlhf.samples  # OpenRLHF modules bind the stub names now

The stubs leave ``sys.modules`` when the block ends, so other tests that probe for an optional
``vllm`` never see them; modules imported inside keep their references.

Load this file by path (``importlib.util.spec_from_file_location``): an installed OpenRLHF ships a
top-level ``tests`` package that shadows ours.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class StubCalled(RuntimeError):
    """A test reached code that needs the real flash_attn / vllm (a GPU)."""


def _unavailable(name: str):
    def fn(*args, **kwargs):
        raise StubCalled(f"{name} is a CPU test stub; this path needs the real package on a GPU")

    fn.__name__ = name.rsplit(".", 1)[-1]
    return fn


@dataclass
class SamplingParams:
    """The subset of ``vllm.SamplingParams`` fields OpenRLHF and our executor read or write (vLLM's defaults)."""

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


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__progpo_test_stub__ = True
    # A spec (and no __file__) makes importlib.util.find_spec work; transformers then sees a
    # namespace-like package without a version and treats flash_attn as absent.
    mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    return mod


def install_stubs() -> list[str]:
    """Put stub ``flash_attn`` and ``vllm`` modules into ``sys.modules``; returns the names added.

    A real installed package is never shadowed: if ``import vllm`` / ``import flash_attn``
    works, that package is used instead. transformers' model code is imported first so that
    its own optional-package probes run before any stub exists.
    """
    import transformers.modeling_utils  # noqa: F401

    added: list[str] = []
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        fa = _module("flash_attn")
        fa.bert_padding = _module(
            "flash_attn.bert_padding",
            index_first_axis=_unavailable("flash_attn.bert_padding.index_first_axis"),
            pad_input=_unavailable("flash_attn.bert_padding.pad_input"),
            unpad_input=_unavailable("flash_attn.bert_padding.unpad_input"),
            rearrange=_unavailable("flash_attn.bert_padding.rearrange"),
        )
        fa.utils = _module("flash_attn.utils")
        fa.utils.distributed = _module(
            "flash_attn.utils.distributed", all_gather=_unavailable("flash_attn.utils.distributed.all_gather")
        )
        for mod in (fa, fa.bert_padding, fa.utils, fa.utils.distributed):
            sys.modules[mod.__name__] = mod
            added.append(mod.__name__)
    try:
        import vllm  # noqa: F401
    except ImportError:
        vl = _module(
            "vllm",
            __version__="0.29.0",
            SamplingParams=SamplingParams,
            AsyncEngineArgs=_unavailable("vllm.AsyncEngineArgs"),
            AsyncLLMEngine=types.SimpleNamespace(from_engine_args=_unavailable("vllm.AsyncLLMEngine")),
        )
        vl.inputs = _module("vllm.inputs", TokensPrompt=dict)
        vl.utils = _module("vllm.utils", random_uuid=_unavailable("vllm.utils.random_uuid"))
        for mod in (vl, vl.inputs, vl.utils):
            sys.modules[mod.__name__] = mod
            added.append(mod.__name__)
    return added


@contextmanager
def stubbed() -> Iterator[None]:
    """Stubs present inside the block only (see module docstring)."""
    added = install_stubs()
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)
