"""The precision of a run's matmuls: fp32 by default, bf16 mixed precision on request, and the machine's bf16 capability.

Mixed precision here is PyTorch's own automatic mixed precision: the forward passes (warm start, the
behaviour / reference log-prob passes, the training pass, generation) run under
``torch.autocast(device_type, dtype=torch.bfloat16)``, so matmuls and linear layers compute in bf16
while the weights, their gradients and the AdamW state stay fp32 (the master weights are the model's
own fp32 parameters; the backward pass runs outside the context, as PyTorch's AMP recipe says).
``log_softmax`` is on autocast's fp32 list, the output head runs in fp32 (:func:`fp32_output_head`) and
:func:`progpo.run.logprobs.sequence_logprobs` casts the logits to fp32, so log-probs and losses are fp32.

The capability is read from the CPU's flags as torch reads them (``torch.cpu.get_capabilities()``,
cpuinfo's view of CPUID): ``amx_bf16`` (Intel AMX) or ``avx512_bf16`` (AVX512-BF16 dot products) mean
that oneDNN runs bf16 GEMMs natively, faster than fp32; without them bf16 is emulated, far slower than fp32
(the rates measured on each kind of CPU: docs/training.md, "Precision"). The flags, not a timed probe, are
read: a probe on a machine shared with other jobs swings from run to run, and a run's precision must not
change between a run and its resume (or the warm-start cache key). ``python -m benchmarks roofline`` measures both GEMM
rates beside it.

``auto`` is fp32 even where bf16 is native: the autocast forward rounds the weights to bf16, and the
small steps of fine-tuning are lost to that rounding (:func:`resolve_precision`; docs/training.md,
"Precision"). On a CUDA device the capability is ``torch.cuda.is_bf16_supported()``.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch


MixedPrecision = Literal["auto", "bf16", "off"]
"""The ``--ds.mixed_precision`` setting."""

MIXED_PRECISION_CHOICES: tuple[str, ...] = get_args(MixedPrecision)
"""The choices, read from the Literal (written once)."""

NATIVE_BF16_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16")
"""``torch.cpu.get_capabilities()`` keys that mean native bf16 matmuls (either one suffices)."""


@dataclass(frozen=True)
class Bf16Capability:
    """Whether this machine computes bf16 matmuls natively.

    Attributes:
        native: bf16 GEMMs run on dedicated instructions (AMX / AVX512-BF16, or a CUDA GPU with bf16).
        device: ``"cpu"`` or ``"cuda"``.
        detail: what was read, in words (``"AMD EPYC: avx512_bf16"``, ``"AMD EPYC: no amx_bf16 or avx512_bf16"``).
    """

    native: bool
    device: str
    detail: str


def bf16_capability(device_type: str = "cpu", capabilities: Mapping[str, Any] | None = None,
                    cuda_bf16: bool | None = None) -> Bf16Capability:
    """Read the bf16 capability of ``device_type``.

    Args:
        device_type: ``"cpu"`` or ``"cuda"``.
        capabilities: for the CPU, a ``torch.cpu.get_capabilities()``-shaped mapping (flag name -> bool,
            ``cpu_name``); None reads this machine's (tests inject one).
        cuda_bf16: for CUDA, whether the GPU supports bf16; None asks ``torch.cuda.is_bf16_supported()``.

    Raises:
        ValueError: ``device_type`` is neither ``"cpu"`` nor ``"cuda"``.
    """
    if device_type == "cuda":
        ok = torch.cuda.is_bf16_supported() if cuda_bf16 is None else bool(cuda_bf16)
        return Bf16Capability(ok, "cuda", "CUDA GPU " + ("with bf16" if ok else "without bf16"))
    if device_type != "cpu":
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    caps = torch.cpu.get_capabilities() if capabilities is None else capabilities
    name = str(caps.get("cpu_name") or "CPU")
    have = [f for f in NATIVE_BF16_FLAGS if caps.get(f)]
    if have:
        return Bf16Capability(True, "cpu", f"{name}: {', '.join(have)}")
    return Bf16Capability(False, "cpu", f"{name}: no {' or '.join(NATIVE_BF16_FLAGS)}")


@dataclass(frozen=True)
class Precision:
    """The resolved precision of a run's forward passes.

    Attributes:
        autocast: run forward passes under ``torch.autocast(device, bfloat16)`` (bf16 matmuls, fp32 weights).
        device: the autocast device type (``"cpu"`` / ``"cuda"``).
        reason: why, in words (printed at start-up).
    """

    autocast: bool
    device: str
    reason: str

    @property
    def name(self) -> str:
        """``"bf16-mixed"`` or ``"fp32"`` (``"bf16"`` weights are the actor's ``param_dtype``, not this)."""
        return "bf16-mixed" if self.autocast else "fp32"

    def context(self) -> contextlib.AbstractContextManager:
        """The autocast context of a forward pass (a no-op context in fp32). Autocast state is per
        thread: enter it in the thread that runs the model."""
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device, dtype=torch.bfloat16)


FP32 = Precision(False, "cpu", "fp32")
"""Plain fp32 (no autocast)."""


def check_precision_settings(setting: str, param_dtype: str = "fp32") -> None:
    """Refuse an unknown ``--ds.mixed_precision`` / ``--ds.param_dtype`` or the two bf16s together.

    Raises:
        ValueError: naming the flag and the value.
    """
    if setting not in MIXED_PRECISION_CHOICES:
        raise ValueError(f"--ds.mixed_precision must be one of {', '.join(MIXED_PRECISION_CHOICES)}, got {setting!r}")
    if param_dtype not in ("fp32", "bf16"):
        raise ValueError(f"--ds.param_dtype must be fp32 or bf16, got {param_dtype!r}")
    if param_dtype == "bf16" and setting == "bf16":
        raise ValueError("--ds.mixed_precision bf16 keeps fp32 weights under bf16 matmuls, but --ds.param_dtype "
                         "bf16 makes the weights bf16: pass one of them")


def resolve_precision(setting: str, *, param_dtype: str = "fp32", device_type: str = "cpu",
                      capability: Bf16Capability | None = None) -> Precision:
    """Turn ``--ds.mixed_precision`` into a :class:`Precision`.

    ``auto``: fp32, with the reason read from the device (:func:`bf16_capability`): where bf16 is emulated
    it would be slow; where it is native, bf16 matmuls round the fp32 master weights to bf16 in every
    forward pass, and fine-tuning steps below half a bf16 spacing are lost to that rounding (measured on
    SmolLM2-135M, whose checkpoint is bf16: docs/training.md, "Precision"), so learning parity with fp32
    does not hold; ``bf16``: bf16 mixed precision (faster prefill and training where native, slow where
    emulated; speed-ups: docs/training.md, "Throughput against this machine's bound"); ``off``: fp32. With
    ``--ds.param_dtype bf16`` the weights are bf16 already: ``auto`` and ``off`` add no autocast, and
    ``bf16`` is refused.

    Args:
        setting: ``auto``, ``bf16`` or ``off``. param_dtype: ``--ds.param_dtype`` (``fp32`` / ``bf16``).
        device_type: where the model runs. capability: the device's (None: read it; tests inject one).

    Raises:
        ValueError: an unknown ``setting`` or ``param_dtype``, or ``bf16`` with ``--ds.param_dtype bf16``
            (each names the flag and the value).
    """
    check_precision_settings(setting, param_dtype)
    if param_dtype == "bf16":
        return Precision(False, device_type, "--ds.param_dtype bf16: the weights themselves are bf16 (no autocast)")
    if setting == "off":
        return Precision(False, device_type, "--ds.mixed_precision off")
    cap = bf16_capability(device_type) if capability is None else capability
    if setting == "bf16":
        slow = "" if cap.native else "; bf16 is emulated here, expect it slower than fp32"
        return Precision(True, device_type, f"--ds.mixed_precision bf16 ({cap.detail}{slow})")
    if cap.native:
        return Precision(False, device_type, f"--ds.mixed_precision auto: native bf16 ({cap.detail}), but bf16 "
                         "matmuls round away fine-tuning steps below half a bf16 spacing (docs/training.md, "
                         "Precision); --ds.mixed_precision bf16 uses them")
    return Precision(False, device_type, f"--ds.mixed_precision auto: bf16 would be emulated ({cap.detail})")


def fp32_output_head(model: torch.nn.Module, device_type: str = "cpu") -> None:
    """Make ``model``'s output head (the ``[d] -> [V]`` logits projection) compute in fp32 under autocast.

    Under bf16 autocast the logits would be rounded to bf16: 8 significant bits, an error of up to
    0.06 nats on a logit of 20, straight into every log-prob and PPO ratio (its effect measured on
    SmolLM2-135M: docs/training.md, "Precision"). The head's
    forward is wrapped with PyTorch's ``torch.amp.custom_fwd(cast_inputs=torch.float32)``: inside an
    autocast region it runs with autocast disabled on fp32 inputs (the fp32 master weights), outside it
    is unchanged. Parameters and state dict are untouched. Idempotent.

    Args:
        model: a Hugging Face causal LM (or its peft wrapper), on ``device_type``.
        device_type: the autocast device type.

    Raises:
        ValueError: ``model`` has no output embeddings.
    """
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (get_output_embeddings() is None)")
    if getattr(head, "_progpo_fp32_head", False):
        return
    head.forward = types.MethodType(torch.amp.custom_fwd(type(head).forward, device_type=device_type,
                                                         cast_inputs=torch.float32), head)
    head._progpo_fp32_head = True
