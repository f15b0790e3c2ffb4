"""LoRA adapters through ``peft``: wrapping a model, and its weights with the adapter merged in.

LoRA (Hu et al. 2021, arXiv 2106.09685, eq. 3) trains a low-rank update of each adapted weight
matrix and leaves the pretrained one frozen::

    W' = W + (alpha / r) * B A,        W [d_out, d_in], B [d_out, r], A [r, d_in]

``B`` starts at zero, so the adapted model starts equal to the base model; with the adapter disabled
it *is* the base model, which is why the KL reference needs no second copy of the weights.

Both backends share this module: the local backend (``progpo.trainer.actor``: wrapping, reference,
the merged Hugging Face folder of a checkpoint) and the OpenRLHF path (``progpo.openrlhf.trainer``:
the merged weights sent to the generation engines, whose models have no adapter). The merge is peft's
own ``get_delta_weight`` (``scaling`` and ``fan_in_fan_out`` included), computed into new tensors:
the live weights are never merged and unmerged in place (which would round them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

ADAPTER_DIR = "adapter"
"""Folder of a checkpoint holding the peft adapter (``adapter_config.json`` + weights)."""

TRAINED = "default"
"""peft's name of the adapter a run trains."""

REFERENCE = "reference"
"""Name of the frozen copy of a loaded adapter (:func:`load_lora`): the KL reference of a run that starts from it."""

Gather = Callable[[Sequence[torch.nn.Parameter]], Any]
"""``gather(params)`` -> a context manager in which ``params`` hold full values (ZeRO-3); default none."""


def _no_gather(params: Sequence[torch.nn.Parameter]) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def add_lora(model: torch.nn.Module, *, rank: int, alpha: int, target_modules: Sequence[str] | str,
             dropout: float, seed: int = 0) -> torch.nn.Module:
    """``model`` wrapped by peft with a fresh LoRA adapter (OpenRLHF 0.11.2's ``LoraConfig``: causal LM, no bias).

    Only the adapter's ``A`` and ``B`` are trainable afterwards. ``target_modules`` ``("all-linear",)``
    (or ``"all-linear"``) adapts every linear layer except the output head. ``A``'s random start is
    drawn from ``seed`` (the global torch RNG is left as it was), so a run is reproducible.

    Raises:
        ValueError: ``rank < 1`` or a target module that matches nothing (peft's message).
    """
    from peft import LoraConfig, TaskType, get_peft_model

    if rank < 1:
        raise ValueError(f"--ds.lora.rank must be >= 1 to add an adapter, got {rank}")
    targets: Sequence[str] | str = target_modules
    if not isinstance(targets, str):
        targets = list(targets)
        if targets == ["all-linear"]:
            targets = "all-linear"
    config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=alpha, target_modules=targets,
                        lora_dropout=dropout, bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def load_lora(model: torch.nn.Module, adapter_dir: str, *, rank: int, reference: bool) -> torch.nn.Module:
    """``model`` wrapped by peft with the trained adapter of ``adapter_dir`` (a peft ``save_pretrained`` folder),
    trainable, instead of a fresh one: ``train``'s RL after a warm start with ``--sft.lora true`` goes on
    training the adapter the behaviour cloning trained, and the base weights stay as they were.

    With ``reference``, a second, frozen copy of the same adapter is loaded under :data:`REFERENCE`: the KL
    reference is then the warm-started policy (:func:`reference_context`), as it is after a full clone,
    not the base model without the clone. The adapter's alpha, target modules and dropout are its own
    config's (``train``'s warm-start cache key holds ``--ds.lora.*``, so there they are the run's).

    Raises:
        FileNotFoundError: no ``adapter_config.json`` in ``adapter_dir``.
        ValueError: the adapter's rank differs from ``rank`` (``--ds.lora.rank``).
    """
    import json
    from pathlib import Path

    from peft import PeftModel

    config = Path(adapter_dir) / "adapter_config.json"
    if not config.is_file():
        raise FileNotFoundError(f"no LoRA adapter in {adapter_dir} (adapter_config.json missing)")
    saved = json.loads(config.read_text()).get("r")
    if saved != rank:
        raise ValueError(f"--ds.lora.rank is {rank} but the adapter in {adapter_dir} has rank {saved}")
    model = PeftModel.from_pretrained(model, adapter_dir, adapter_name=TRAINED, is_trainable=True)
    if reference:
        model.load_adapter(adapter_dir, adapter_name=REFERENCE, is_trainable=False)
        model.set_adapter(TRAINED)  # the trained one active and trainable, the copy frozen
    return model


def is_lora(model: Any) -> bool:
    """True when ``model`` is a peft model (an adapter is attached)."""
    try:
        from peft import PeftModel
    except ImportError:  # peft not installed: no model can carry an adapter
        return False
    return isinstance(model, PeftModel)


def iter_merged(model: torch.nn.Module, *, parameters_only: bool = False,
                gather: Gather = _no_gather) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights of the model the adapter stands for, one ``(name, tensor)`` at a time, under the base
    model's own names (a Hugging Face ``state_dict`` of the base class, adapter merged).

    For a model without an adapter: its own ``state_dict`` (or ``named_parameters``) entries, copied.
    For a peft model: every base entry (``...q_proj.base_layer.weight`` named ``...q_proj.weight``), with
    ``W + scaling * B A`` in place of each adapted weight; the adapter's own tensors are left out.

    Args:
        model: a causal LM, peft-wrapped or not.
        parameters_only: yield parameters only (tied weights once, no buffers): what an engine's
            ``load_weights`` takes; else every ``state_dict`` entry: what ``save_pretrained`` writes.
        gather: context giving full values of the parameters listed (ZeRO-3); entered per entry.

    Yields:
        ``(name, tensor)`` with ``tensor`` a detached copy (the merged one in the weight's dtype); tied
        entries (one parameter under two names, e.g. embeddings and output head) share one copy, as
        they share one tensor in the model, so ``save_pretrained`` writes it once.
    """
    copies: dict[int, torch.Tensor] = {}

    def copy(value: torch.Tensor) -> torch.Tensor:
        if id(value) not in copies:
            with gather([value] if isinstance(value, torch.nn.Parameter) else []):
                copies[id(value)] = value.detach().clone()
        return copies[id(value)]

    if not is_lora(model):
        named = model.named_parameters() if parameters_only else model.state_dict(keep_vars=True).items()
        for name, value in named:
            yield name, copy(value)
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapter = model.active_adapter
    adapted = {name: module for name, module in base.named_modules()
               if isinstance(module, LoraLayer) and adapter in module.lora_A}
    named = base.named_parameters() if parameters_only else base.state_dict(keep_vars=True).items()
    for key, value in named:
        if ".lora_" in key:
            continue
        owner, _, leaf = key.rpartition(".")
        if owner.endswith(".base_layer") and owner[: -len(".base_layer")] in adapted and leaf == "weight":
            module = adapted[owner[: -len(".base_layer")]]
            params = [value, module.lora_A[adapter].weight, module.lora_B[adapter].weight]
            with gather(params), torch.no_grad():
                merged = (value + module.get_delta_weight(adapter)).to(value.dtype)
            yield owner[: -len(".base_layer")] + ".weight", merged.detach().clone()
            continue
        yield key.replace(".base_layer.", "."), copy(value)


def merged_parameter_names(model: torch.nn.Module) -> list[str]:
    """The names :func:`iter_merged` yields with ``parameters_only=True``, in order, without computing a tensor."""
    if not is_lora(model):
        return [name for name, _ in model.named_parameters()]
    return [name.replace(".base_layer.", ".") for name, _ in model.get_base_model().named_parameters()
            if ".lora_" not in name]


def merged_state_dict(model: torch.nn.Module, gather: Gather = _no_gather) -> dict[str, torch.Tensor]:
    """:func:`iter_merged` as a dict (every ``state_dict`` entry of the base model, adapter merged)."""
    return dict(iter_merged(model, gather=gather))


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model under a peft wrapper (``model`` itself when there is none): its class and
    ``config`` are what a merged folder is saved as."""
    return model.get_base_model() if is_lora(model) else model


def reference_context(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """Context in which ``model`` computes as the KL reference of a LoRA run: with a :data:`REFERENCE` adapter
    (:func:`load_lora`) that frozen copy active, else its base model (peft's ``disable_adapter``). A model
    without an adapter is itself (no context)."""
    if not is_lora(model):
        return contextlib.nullcontext()
    if REFERENCE in model.peft_config:
        return _active(model, REFERENCE)
    return model.disable_adapter()


@contextlib.contextmanager
def _active(model: Any, name: str) -> Iterator[None]:
    """``model``'s adapter ``name`` active (frozen) inside, the trained one active and trainable again after."""
    trained = model.active_adapter
    model.set_adapter(name, inference_mode=True)
    try:
        yield
    finally:
        model.set_adapter(trained)
