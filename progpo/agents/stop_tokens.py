"""Where an answer ends: the tokenizer's EOS and the end-of-turn token its chat template writes.

A sampled answer must stop where the chat template ends an assistant turn. A tokenizer's ``eos_token`` and its
template's turn end can differ (eos ``<|im_end|>`` with a template that closes turns with ``<|endoftext|>``, or a
base model's eos ``<|endoftext|>`` with ChatML's ``<|im_end|>``); a generator that stops at EOS only then runs
every answer to ``--rollout.max_new_tokens``. :func:`stop_token_ids` is the one stop set of every backend (the
local ``HFGenerator``, ``--rollout.backend vllm`` and the OpenRLHF executor's vLLM requests): the EOS ids and the
turn end :func:`turn_end_id` derives from the template by rendering a conversation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from progpo.agents.parsing import ANSWER_TAG

_USER, _ANSWER, _NEXT = "\ue000U\ue001", "\ue000A\ue001", "\ue000N\ue001"  # private-use stand-ins for contents
_FIX = ("Set tokenizer.chat_template to one that ends each assistant turn with a special token (ChatML's "
        "<|im_end|>), or register that text as a special token (tokenizer.add_special_tokens), and save both in the "
        "model folder (tokenizer.save_pretrained)")


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The chat template applied to ``messages`` (no generation prompt); ValueError with one line if it fails."""
    from jinja2.exceptions import TemplateError

    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat_template, so the end of an assistant turn is unknown; " + _FIX)
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    except (TemplateError, ValueError, TypeError) as exc:
        raise ValueError(f"the chat template cannot render a user turn followed by an assistant answer "
                         f"({' '.join(str(exc).split())}); {_FIX}") from exc


def turn_end_text(tokenizer: Any) -> str:
    """What the chat template writes right after an assistant answer (raw, whitespace kept).

    Renders ``[user, assistant]`` and takes the text after the answer. A template that writes nothing
    there (the last answer left open) is rendered once more with a user turn after the answer, and the
    text between the answer and that turn is taken (the turn end followed by the next turn's opening).

    Raises:
        ValueError: no chat template, a template that fails to render, or one that does not show the
            answer verbatim (one line; says what to change).
    """
    user, answer = {"role": "user", "content": _USER}, {"role": "assistant", "content": _ANSWER}
    text = _render(tokenizer, [user, answer])
    head, sep, tail = text.rpartition(_ANSWER)
    if not sep:
        raise ValueError("the chat template does not show an assistant answer verbatim, so where an answer ends "
                         "is unknown; " + _FIX)
    if tail.strip():
        return tail
    text = _render(tokenizer, [user, answer, {"role": "user", "content": _NEXT}])
    return text.partition(_ANSWER)[2].partition(_NEXT)[0]


def _control_ids(tokenizer: Any) -> set[int]:
    """Ids of every registered token (special or added): tokens a model emits as one unit, never inside text."""
    return set(tokenizer.added_tokens_decoder) | set(tokenizer.all_special_ids)


def turn_end_id(tokenizer: Any) -> int:
    """The id of the token that ends an assistant turn in ``tokenizer``'s chat template.

    The first token of :func:`turn_end_text` (tokenized as written, leading whitespace-only tokens skipped: the
    template's ``"<|im_end|>\\n"``, ``" </s>"`` or ``"<end_of_turn>\\n"``), which must be a registered token: a
    turn end of several tokens (``"<|end|><|endoftext|>"``) ends at its first one, since the answer is over once
    the model writes it. A turn end in plain text (``"###"``, ``"\\n\\nUser:"``) is refused: a stop at one of its
    tokens would cut answers that hold that text. So is an answer tag (``</action>``, however the token spells
    it: ``" </action> "`` too), at which every answer would stop before its action.

    Raises:
        ValueError: the turn end cannot be derived (see :func:`turn_end_text`), is empty, is not a
            registered token, or is an answer tag (one line; says what to change).
    """
    text = turn_end_text(tokenizer)
    shown = text.strip() or text
    control = _control_ids(tokenizer)
    for tok in tokenizer(text, add_special_tokens=False)["input_ids"]:  # unstripped: a token may hold the spaces
        spelled = tokenizer.convert_ids_to_tokens(int(tok))
        if tok in control and ANSWER_TAG.fullmatch(str(spelled).strip()):
            raise ValueError(f"the chat template ends an assistant turn with {shown!r}, whose first token {spelled!r} "
                             "is an answer tag, so every answer would stop before its action; " + _FIX)
        if tok in control:
            return int(tok)
        if tokenizer.decode([tok], skip_special_tokens=False).strip():
            break
    raise ValueError(f"the chat template ends an assistant turn with {shown!r}, which starts with no registered "
                     "token of the tokenizer, so generation has no token to stop at; " + _FIX)


def _ids(value: Any) -> list[int]:
    """An ``eos_token_id`` value (None, an int or a list of ints) as a list."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, Sequence) else [int(value)]


def stop_token_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """The stop set: every token id that ends a sampled answer, sorted.

    ``tokenizer.eos_token_id``, the ``eos_token_id`` (int or list) of ``generation_config`` (a checkpoint's
    ``GenerationConfig``, or None), and the chat template's turn end (:func:`turn_end_id`).

    Raises:
        ValueError: the turn end cannot be derived (one line; says what to change).
    """
    ids = _ids(tokenizer.eos_token_id) + _ids(getattr(generation_config, "eos_token_id", None))
    return sorted(set(ids) | {turn_end_id(tokenizer)})
