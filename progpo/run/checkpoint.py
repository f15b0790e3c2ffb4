"""Checkpoints: HF model folder + DeepSpeed engine state (optimizer) + RNG + step + data order.

Layout under ``<save_path>/checkpoints/``::

    iter_000002/
        hf/                 the actor as a Hugging Face folder (config, weights, tokenizer); with LoRA
                            the adapter merged in (``progpo.run.lora``), so any HF loader takes it
        adapter/            with LoRA only: the peft adapter (``adapter_config.json`` + weights)
        ds/                 DeepSpeed ``save_checkpoint`` (module + optimizer state; with LoRA the
                            trainable adapter only, the frozen base comes from the pretrained model)
        trainer_state.json  {"iteration": 2, "sampler": {...}, "seed": ...}
        rng.pt              python / numpy / torch RNG states and the run's numpy Generator state
    latest                  name of the newest complete checkpoint

A checkpoint is written to a hidden temporary folder ``.tmp-iter_*`` next to its final place; every file and
folder in it is fsynced, then it is renamed into place (``os.replace``, atomic), the checkpoint folder is
fsynced, and ``latest`` is rewritten the same way (temporary file, fsync, rename), as DeepSpeed's and
Lightning's ``latest`` tags. Only then are older checkpoints rotated out (``max_keep`` kept), each first renamed
to ``.old-iter_*`` so a half-deleted one never carries a checkpoint's name. A run killed at any moment of a
save therefore leaves every ``iter_*`` folder complete: :meth:`CheckpointManager.latest` is the newest of them
(``latest`` may lag one behind it when the kill fell between the rename and the marker), and the hidden
leftovers are ignored and cleaned at the next save. No checkpoint is written from non-finite weights
(:class:`~progpo.run.divergence.NonFiniteUpdate`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from progpo.run.atomic import atomic_write_text, fsync_path, fsync_tree
from progpo.run.divergence import LR_FLAG, NonFiniteUpdate, first_nonfinite

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^iter_(\d{6})$")


def check_run_dir(path: str | os.PathLike, flag: str = "--ckpt.path") -> Path:
    """Check, before any costly work, that folder ``path`` can be made and written (creates nothing).

    Raises:
        ValueError: ``path`` or a parent of it is a file, or the nearest existing folder is not
            writable; the message names ``flag`` and the path.
    """
    out = Path(path).expanduser()
    existing = next(p for p in (out, *out.parents) if p.exists())  # "/" or "." at the latest
    if not existing.is_dir():
        where = "" if existing == out else f": {existing} is a file"
        raise ValueError(f"{flag} {out}{where or ' is a file'}, not a folder; choose another {flag}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {out}: {existing} is not writable")
    return out


def rng_state(generator: np.random.Generator) -> dict[str, Any]:
    """All RNG states a run depends on (python, numpy global, torch CPU, the run's Generator)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generator": generator.bit_generator.state,
    }


def restore_rng(state: dict[str, Any], generator: np.random.Generator) -> None:
    """Inverse of ``rng_state`` (sets the global RNGs and ``generator`` in place)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.bit_generator.state = state["generator"]


def hf_state(actor) -> dict[str, torch.Tensor]:
    """The actor's weights as its Hugging Face folder holds them (name -> CPU tensor; ZeRO-3 parameters gathered;
    with a LoRA adapter, the base model's with the adapter merged in, :func:`progpo.run.lora.iter_merged`)."""
    from progpo.run.lora import merged_state_dict

    with actor.generation_context():
        return {k: v.cpu() for k, v in merged_state_dict(actor.model).items()}


def save_hf(actor, out_dir: Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """Write the actor as a Hugging Face folder: ``state`` (default :func:`hf_state`) and the tokenizer."""
    from progpo.run.lora import base_model

    base_model(actor.model).save_pretrained(out_dir, state_dict=hf_state(actor) if state is None else state)
    actor.tokenizer.save_pretrained(out_dir)


def save_adapter(actor, out_dir: Path) -> None:
    """Write the actor's trained peft adapter (``adapter_config.json`` + adapter weights) to ``out_dir`` (not a
    frozen reference copy, :func:`progpo.run.lora.load_lora`)."""
    with actor.generation_context():
        actor.model.save_pretrained(out_dir, selected_adapters=[actor.model.active_adapter])


class CheckpointManager:
    """Saves and finds checkpoints of one run.

    Args:
        save_path: the run folder; checkpoints go to ``save_path/checkpoints``.
        max_keep: newest checkpoints kept (older ones are deleted after a successful save).
        lr_flag: the learning-rate flag a refusal of non-finite weights names (``train``'s, or ``--sft.lr``).

    Attributes:
        on_stage: None, or called as ``on_stage(stage, iteration)`` at each stage of :meth:`save`: ``partial``
            (the temporary folder holds the HF weights only), ``written`` (it is complete and synced, not yet
            renamed), ``published`` (renamed into place; ``latest`` not yet rewritten), ``marked`` (``latest``
            rewritten; older checkpoints not yet rotated), ``rotating`` (an old checkpoint renamed away, not yet
            deleted). For fault tests (a kill at each stage) and progress.
    """

    on_stage: Callable[[str, int], None] | None = None

    def __init__(self, save_path: str | os.PathLike, max_keep: int = 2, lr_flag: str = LR_FLAG) -> None:
        if max_keep < 1:
            raise ValueError(f"max_keep must be >= 1, got {max_keep}")
        self.root = Path(save_path) / "checkpoints"
        self.max_keep = max_keep
        self.lr_flag = lr_flag

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first: the ``iter_*`` folders (only a complete one is renamed to that name)
        holding ``trainer_state.json``."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and _NAME.match(p.name)
                      and (p / "trainer_state.json").exists())

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None. ``latest`` names it after every finished save; after a kill
        between a checkpoint's rename and the marker's, the renamed one is newer than the marker and is taken."""
        done = self.complete()
        return done[-1] if done else None

    def save(self, actor, iteration: int, trainer_state: dict[str, Any], generator: np.random.Generator) -> Path:
        """Write checkpoint ``iter_<iteration>`` atomically (see the module docstring); returns its final path.

        Raises:
            NonFiniteUpdate: a weight holds inf or NaN (nothing is written; the newest checkpoint is kept).
        """
        state = hf_state(actor)
        bad = first_nonfinite(state)
        if bad is not None:
            kept = self.latest()
            raise NonFiniteUpdate(f"iteration {iteration}: weight {bad} is not finite, so no checkpoint was written "
                                  f"(the newest is {kept.name if kept else 'none'}); the updates diverge: lower "
                                  f"{self.lr_flag}")
        self.root.mkdir(parents=True, exist_ok=True)
        self._clean()
        name = f"iter_{iteration:06d}"
        tmp = self.root / f".tmp-{name}"
        final = self.root / name
        self._write(tmp, actor, state, {**trainer_state, "iteration": iteration}, generator, iteration)
        self._stage("written", iteration)
        old = self.root / f".old-{name}"
        if final.exists():  # the same iteration saved again (a resumed run): moved away, deleted once replaced
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_path(self.root)
        self._stage("published", iteration)
        atomic_write_text(self.root / "latest", name)
        self._stage("marked", iteration)
        self.tidy(iteration)  # deletes ``old`` too
        logger.info("checkpoint written: %s", final)
        return final

    def tidy(self, iteration: int = 0) -> None:
        """Delete what a killed save left (hidden ``.tmp-*`` / ``.old-*`` folders) and the complete checkpoints
        beyond the newest ``max_keep``, each renamed to ``.old-*`` before it is deleted (``iteration``: for
        ``on_stage``). Called after every save and when a run resumes (a kill may have come before rotation)."""
        self._clean()
        for done in self.complete()[: -self.max_keep]:
            trash = self.root / f".old-{done.name}"
            os.replace(done, trash)
            self._stage("rotating", iteration)
            shutil.rmtree(trash, ignore_errors=True)

    def _clean(self) -> None:
        if self.root.is_dir():
            for stale in [*self.root.glob(".tmp-*"), *self.root.glob(".old-iter_*")]:
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
                else:  # the marker's temporary file
                    stale.unlink(missing_ok=True)

    def _write(self, tmp: Path, actor, state: dict[str, torch.Tensor], trainer_state: dict[str, Any],
               generator: np.random.Generator, iteration: int) -> None:
        """Every file of a checkpoint into the fresh folder ``tmp``, then fsynced."""
        from progpo.run.lora import ADAPTER_DIR, is_lora

        tmp.mkdir()
        save_hf(actor, tmp / "hf", state)
        self._stage("partial", iteration)
        lora = is_lora(actor.model)
        if lora:
            save_adapter(actor, tmp / ADAPTER_DIR)
        actor.engine.save_checkpoint(str(tmp / "ds"), tag="state", exclude_frozen_parameters=lora)
        torch.save(rng_state(generator), tmp / "rng.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))
        fsync_tree(tmp)

    def _stage(self, stage: str, iteration: int) -> None:
        if self.on_stage is not None:
            self.on_stage(stage, iteration)

    @staticmethod
    def load(actor, path: Path, generator: np.random.Generator) -> dict[str, Any]:
        """Load engine (module + optimizer) and RNG states from ``path``; returns the trainer state."""
        from progpo.run.lora import is_lora

        load_path, _ = actor.engine.load_checkpoint(str(path / "ds"), tag="state", load_optimizer_states=True,
                                                    load_lr_scheduler_states=actor.engine.lr_scheduler is not None,
                                                    load_module_strict=not is_lora(actor.model))
        if load_path is None:
            raise FileNotFoundError(f"DeepSpeed state missing or unreadable in {path / 'ds'}")
        restore_rng(torch.load(path / "rng.pt", weights_only=False), generator)
        return json.loads((path / "trainer_state.json").read_text())
