"""The small transformer policy of the synthetic envs, built from a config in code (no hub needed).

``--actor.model_name_or_path tiny-agent`` (:func:`agent_model_path`) is a randomly initialised
``Qwen2ForCausalLM`` (the architecture of the paper's Qwen2.5 policies, :class:`AgentModelConfig`) with a
byte-level BPE tokenizer trained in code on the synthetic envs' own prompt text: the real envs' templates
(:mod:`progpo.agents.templates`) rendered over episodes of every registered env whose entry point is
:class:`~progpo.envs.synthetic.env.SyntheticEnv`, their observations, admissible actions and the experts'
answers. It keeps the prompt protocol: Qwen's ChatML turn format (``<|im_start|>``, ``<|im_end|>`` as EOS, no
default system turn) and ``<think>``, ``</think>``, ``<action>``, ``</action>`` as single, non-special tokens
(as Qwen3's ``<think>``; ``decode_response`` keeps answer tags of any kind).

Why this size and tokenizer (the measurements: docs/training.md, "Models"; the clones' skill on unseen
tasks: docs/fidelity.md, "Why micro-batches of 2"):

* **Tokenizer.** Trained on the envs' own text it stops growing (no more merges) far below SmolLM2's
  49,152 tokens, so the tied embedding/output matrix stays small and the output softmax does not dominate
  the cost. Every receptacle, object and option word of the envs is one token, so an action is a few tokens
  and step texts are shorter than with SmolLM2's tokenizer.
* **Size.** Width 64, 2 layers, 4 heads (2 KV heads), MLP 256. The model must train inside a CI test, so
  cost decides. A wider model learned no more from a short clone; cloned on many more tasks for longer,
  width 64 does read the prompt, and that skill (copying a receptacle's number) arrives in a jump that a
  run may miss (``research.learning_lm.FRESH_CLONE_NOTE``).

Built once into ``~/.cache/progpo/models/tiny-agent-<hash>`` (written to a temporary folder, then renamed),
keyed on the config and the corpus version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path

from progpo.agents.parsing import ANSWER_TAGS
from progpo.run.tiny_model import CHATML_TEMPLATE, MODELS_DIR, SPECIAL_TOKENS, save_model_folder

logger = logging.getLogger(__name__)

_CORPUS_VERSION = "1"  # bump when the corpus or the tokenizer recipe changes (changes the cache folder)


@dataclass(frozen=True)
class AgentModelConfig:
    """Size of the transformer policy (``Qwen2Config`` fields) and of its tokenizer.

    Attributes:
        hidden_size: model width ``d``. num_layers: decoder layers. num_heads / num_kv_heads: attention heads
            (grouped-query attention; ``d`` divisible by ``num_heads``). intermediate_size: MLP width.
        vocab_size: BPE vocabulary limit (the trainer stops earlier when the corpus has no more merges).
        max_positions: context limit in tokens (rotary embeddings). corpus_tasks: tasks per env played to
            build the tokenizer corpus. seed: torch seed of the random weights.
    """

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    vocab_size: int = 2048
    max_positions: int = 2048
    corpus_tasks: int = 48
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
                     "max_positions", "corpus_tasks"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"AgentModelConfig: hidden_size {self.hidden_size} must be divisible by num_heads "
                             f"{self.num_heads}, and num_heads by num_kv_heads {self.num_kv_heads}")


def synthetic_env_names() -> list[str]:
    """Registered envs whose entry point is the synthetic env class (read from the registry)."""
    from progpo.envs import env_class, env_ids
    from progpo.envs.synthetic.env import SyntheticEnv

    return [name for name in env_ids() if env_class(name) is SyntheticEnv]


def corpus(tasks_per_env: int = 48, seed: int = 0) -> list[str]:
    """Chat-formatted step prompts and answers of the synthetic envs (deterministic).

    Each env plays ``tasks_per_env`` train tasks with a policy that takes the expert's action with
    probability 0.6 and a random admissible one otherwise (so the text of wrong turns appears too);
    every step's user message is rendered with the env's template and a history window of 2, wrapped in
    the ChatML turn format with the expert's answer.
    """
    from progpo.agents.templates import HistoryTurn, build_messages, get_template, render_user_message
    from progpo.envs import make_env
    from progpo.envs.synthetic.env import SyntheticExpert

    rng = random.Random(seed)
    expert = SyntheticExpert()
    lines: list[str] = []
    for name in synthetic_env_names():
        env, tmpl = make_env(name), get_template(name)
        for index in range(tasks_per_env):
            obs, info = env.reset(split="train", index=index)
            history: list[HistoryTurn] = []
            for t in range(env.max_steps):
                user = render_user_message(tmpl, task=info["task"], observation=info["anchor_observation"],
                                           admissible_actions=info["admissible_actions"], history=history[-2:],
                                           step_count=t)
                think, action = expert.act(info)
                turns = build_messages(tmpl, user) + [{"role": "assistant", "content":
                                                       f"<think>{think}</think><action>{action}</action>"}]
                lines.append("".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns))
                if rng.random() > 0.6:
                    action = rng.choice(info["admissible_actions"])
                history.append(HistoryTurn(info["anchor_observation"], action))
                res = env.step(action)
                obs, info = res.observation, res.info
                if res.done:
                    break
    return lines


def build_agent_tokenizer(cfg: AgentModelConfig = AgentModelConfig()):
    """Train the byte-level BPE tokenizer on :func:`corpus` and wrap it as a ``PreTrainedTokenizerFast``.

    Returns:
        A tokenizer with ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (EOS), the answer tags as
        single non-special tokens, and the ChatML chat template.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(cfg.corpus_tasks), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ANSWER_TAGS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_agent_model(out_dir: str | os.PathLike, cfg: AgentModelConfig = AgentModelConfig()) -> Path:
    """Write a random ``Qwen2ForCausalLM`` of size ``cfg`` and its tokenizer to ``out_dir`` (HF folder).

    Returns:
        ``out_dir`` as a Path (written atomically: temporary folder, then rename).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_agent_tokenizer(cfg)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions, tie_word_embeddings=True, attention_dropout=0.0,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out = save_model_folder(model, tokenizer, Path(out_dir))
    (out / "agent_model_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    return out


def agent_model_path(cfg: AgentModelConfig = AgentModelConfig(), models_dir: str | os.PathLike | None = None) -> Path:
    """The cached model folder of ``cfg`` (built on first use)."""
    root = Path(models_dir) if models_dir is not None else MODELS_DIR
    key = json.dumps({"corpus": _CORPUS_VERSION, **dataclasses.asdict(cfg)}, sort_keys=True)
    path = root / f"tiny-agent-{hashlib.sha1(key.encode()).hexdigest()[:8]}"
    if not (path / "config.json").exists():
        logger.info("building the tiny agent model at %s", path)
        build_agent_model(path, cfg)
    return path
