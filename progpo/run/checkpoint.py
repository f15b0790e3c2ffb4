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

A checkpoint is written to a hidden temporary folder next to its final place and renamed into place
(``os.replace``) only when complete; ``latest`` is rewritten the same way. A run killed mid-write
leaves only a ``.tmp-*`` folder, which is ignored and cleaned at the next save.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^iter_(\d{6})$")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a hidden temporary file and a rename (never half written)."""
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text)
    os.replace(tmp, path)


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


def save_hf(actor, out_dir: Path) -> None:
    """Write the actor as a Hugging Face folder (ZeRO-3 parameters are gathered first); with a LoRA
    adapter, the base model's folder with the adapter merged in (:func:`progpo.run.lora.iter_merged`)."""
    from progpo.run.lora import base_model, merged_state_dict

    model = actor.model
    with actor.generation_context():
        state = {k: v.cpu() for k, v in merged_state_dict(model).items()}
    base_model(model).save_pretrained(out_dir, state_dict=state)
    actor.tokenizer.save_pretrained(out_dir)


def save_adapter(actor, out_dir: Path) -> None:
    """Write the actor's peft adapter (``adapter_config.json`` + adapter weights) to ``out_dir``."""
    with actor.generation_context():
        actor.model.save_pretrained(out_dir)


class CheckpointManager:
    """Saves and finds checkpoints of one run.

    Args:
        save_path: the run folder; checkpoints go to ``save_path/checkpoints``.
        max_keep: newest checkpoints kept (older ones are deleted after a successful save).
    """

    def __init__(self, save_path: str | os.PathLike, max_keep: int = 2) -> None:
        if max_keep < 1:
            raise ValueError(f"max_keep must be >= 1, got {max_keep}")
        self.root = Path(save_path) / "checkpoints"
        self.max_keep = max_keep

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and _NAME.match(p.name)
                      and (p / "trainer_state.json").exists())

    def latest(self) -> Path | None:
        """The newest complete checkpoint (via ``latest``, else by name), or None."""
        marker = self.root / "latest"
        if marker.exists():
            path = self.root / marker.read_text().strip()
            if (path / "trainer_state.json").exists():
                return path
        done = self.complete()
        return done[-1] if done else None

    def save(self, actor, iteration: int, trainer_state: dict[str, Any], generator: np.random.Generator) -> Path:
        """Write checkpoint ``iter_<iteration>`` atomically; returns its final path."""
        from progpo.run.lora import ADAPTER_DIR, is_lora

        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".tmp-iter_*"):
            shutil.rmtree(stale, ignore_errors=True)
        name = f"iter_{iteration:06d}"
        tmp = self.root / f".tmp-{name}"
        final = self.root / name
        tmp.mkdir()
        save_hf(actor, tmp / "hf")
        lora = is_lora(actor.model)
        if lora:
            save_adapter(actor, tmp / ADAPTER_DIR)
        actor.engine.save_checkpoint(str(tmp / "ds"), tag="state", exclude_frozen_parameters=lora)
        torch.save(rng_state(generator), tmp / "rng.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({**trainer_state, "iteration": iteration}, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        atomic_write_text(self.root / "latest", name)
        for old in self.complete()[: -self.max_keep]:
            shutil.rmtree(old, ignore_errors=True)
        logger.info("checkpoint written: %s", final)
        return final

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
