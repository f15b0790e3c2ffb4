"""Start-up check: the policy's tokenizer and chat template can carry the answer format.

The episode loop shows the env's prompt through the tokenizer's chat template and reads each answer with
``progpo.agents.templates.decode_response``; the parser then wants ``<think>...</think><action>...</action>``
(``progpo.agents.parsing``). A tokenizer that cannot carry that text would make every answer invalid, and a
run would only show "no signal". Both backends' start-ups (``train``: ``progpo.trainer.loop``; ``train_ray``:
``progpo.cli.train_ray``) call :func:`check_model_answer_format` before any model is loaded, and a failure is
one line that names the flag, the model and what to change:

* the chat template is missing, or does not insert each message's content verbatim (it drops or rewrites
  the env's text): ``encode_messages`` could not tokenize the prompt as what it is;
* the template's generation prompt already holds an answer tag (a ``<think>`` prefilled, as some
  reasoning models' templates do, or Qwen3's ``enable_thinking=False`` empty think block): the model's
  answer would start after it and never have the answer's form;
* an answer does not decode back to itself, written either with the tokenizer's own tokens (tags as
  registered tokens) or as plain text: a tokenizer that lower-cases, splits with spaces (WordPiece) or maps
  ``<`` to its unknown token cannot write the tags;
* the end of an assistant turn cannot be derived from the chat template as one registered token
  (``progpo.agents.stop_tokens.turn_end_id``): generation would have no turn end to stop at, and every answer
  whose turn end is not EOS would run to ``--rollout.max_new_tokens``.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer

from progpo.agents.parsing import ANSWER_TAG, ANSWER_TAGS
from progpo.agents.stop_tokens import turn_end_id
from progpo.agents.templates import (build_messages, decode_response, encode_messages, encode_text, get_template,
                                     render_user_message)

PROBE_ANSWER = "<think>The mug is on the desk, so I go there first.</think><action>go to desk 1</action>"
"""The answer every tokenizer must give back unchanged (tags, words, spaces, punctuation, digits)."""

_SAVE = "and save it in the model folder (tokenizer.save_pretrained)"


def check_answer_format(tokenizer: Any, env_name: str, *, flag: str = "--actor.model_name_or_path",
                        model: str = "") -> None:
    """Refuse a tokenizer whose chat template or tokens would break the answer format (see the module docstring).

    Args:
        tokenizer: the policy's Hugging Face tokenizer.
        env_name: the registered env (``--env.name``) whose prompt template is rendered.
        flag, model: the flag and its value, named in the error.

    Raises:
        ValueError: one line starting with ``flag model:``, saying what breaks and what to change.
    """
    where = f"{flag} {model}:".replace(" :", ":")
    tmpl = get_template(env_name)
    user = render_user_message(tmpl, task="put a mug on the desk.", observation="You are in the middle of a room.",
                               admissible_actions=["go to desk 1", "look"])
    messages = build_messages(tmpl, user)
    try:
        text, _ = encode_messages(tokenizer, messages)
    except ValueError as exc:
        raise ValueError(f"{where} {exc}. Set tokenizer.chat_template to one that inserts every message's content "
                         f"unchanged (e.g. ChatML) {_SAVE}") from exc
    closed = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    opening = text[len(closed):] if text.startswith(closed) else text[-80:]
    tag = ANSWER_TAG.search(opening)
    if tag is not None:
        raise ValueError(f"{where} the chat template's generation prompt {opening!r} already holds {tag.group(0)!r}, "
                         "so every answer would start after it and none could have the form "
                         "<think>...</think><action>...</action>. Set tokenizer.chat_template to one whose generation "
                         f"prompt ends where the assistant's answer starts {_SAVE}")
    try:
        turn_end_id(tokenizer)
    except ValueError as exc:
        raise ValueError(f"{where} {exc}") from exc
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    for how, ids in (("with its own tokens", tokenizer(PROBE_ANSWER, add_special_tokens=False)["input_ids"]),
                     ("as plain text", encode_text(tokenizer, PROBE_ANSWER))):
        back = decode_response(tokenizer, list(ids) + eos)
        if back != PROBE_ANSWER:
            raise ValueError(f"{where} the answer {PROBE_ANSWER!r}, written {how} ({len(ids)} tokens), decodes as "
                             f"{back!r}; the answer tags and text must decode to themselves (a tokenizer that "
                             "lower-cases, joins word pieces with spaces or maps '<' to its unknown token cannot "
                             f"write them). Use a byte-level tokenizer, or add the tags {list(ANSWER_TAGS)} as tokens "
                             f"(tokenizer.add_tokens, then model.resize_token_embeddings) {_SAVE}")


def check_model_answer_format(model_path: str, env_name: str, *, flag: str = "--actor.model_name_or_path",
                              given: str | None = None, trust_remote_code: bool = False) -> None:
    """Load the tokenizer of ``model_path`` (an HF folder or hub id) and :func:`check_answer_format` it.

    Args:
        model_path: the resolved model (``progpo.run.models.resolve_pretrain``).
        env_name: ``--env.name``.
        flag, given: the flag and the value the user gave (shown with ``model_path`` when they differ: an alias).
        trust_remote_code: passed to ``AutoTokenizer.from_pretrained`` (OpenRLHF's actors load with True).

    Raises:
        ValueError: the tokenizer cannot be loaded, or breaks the answer format (one line naming ``flag``).
    """
    shown = model_path if given in (None, model_path) else f"{given} ({model_path})"
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{flag} {shown}: cannot load its tokenizer: {' '.join(str(exc).split())}") from exc
    check_answer_format(tokenizer, env_name, flag=flag, model=shown)
