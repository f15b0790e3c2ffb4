"""The stop set follows the chat template: the end-of-turn token is derived by rendering a conversation, and is
added to EOS whichever way the two differ (issue 44, item 4).

Before, the stop set was the tokenizer's and ``generation_config``'s EOS only: with eos ``<|im_end|>`` and a
template that ends turns with ``<|endoftext|>`` every answer ran to ``--rollout.max_new_tokens``.
"""

from __future__ import annotations

import copy

import pytest
from tokenizers import AddedToken

from progpo.agents.parsing import ANSWER_TAGS
from progpo.agents.stop_tokens import stop_token_ids, turn_end_id, turn_end_text


def _template(turn_end: str, last_open: bool = False) -> str:
    """A ChatML-like template whose turns end with ``turn_end`` (the last assistant answer left open if ``last_open``)."""
    close = f"{{% if not (loop.last and message['role'] == 'assistant') %}}{turn_end}{{% endif %}}" if last_open \
        else turn_end
    return ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
            f"{close}{{% endfor %}}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture
def tiny(answer_tokenizers):
    """A fresh copy of the tiny test tokenizer (eos ``<|im_end|>``, pad ``<|endoftext|>``, ChatML)."""
    return copy.deepcopy(answer_tokenizers["tiny"])


def _id(tok, text: str) -> int:
    (i,) = tok(text, add_special_tokens=False)["input_ids"]
    return i


def test_chatml_turn_end_is_its_eos(tiny):
    assert turn_end_text(tiny) == "<|im_end|>\n"
    assert turn_end_id(tiny) == tiny.eos_token_id == _id(tiny, "<|im_end|>")
    assert stop_token_ids(tiny) == [tiny.eos_token_id]


def test_eos_im_end_with_a_template_ending_turns_with_endoftext(tiny):
    tiny.chat_template = _template("<|endoftext|>\n")
    assert tiny.eos_token == "<|im_end|>"
    assert turn_end_id(tiny) == _id(tiny, "<|endoftext|>")
    assert stop_token_ids(tiny) == sorted({_id(tiny, "<|im_end|>"), _id(tiny, "<|endoftext|>")})


def test_eos_endoftext_with_a_chatml_template(tiny):
    tiny.eos_token = "<|endoftext|>"  # a base model's tokenizer with an instruct (ChatML) template
    assert turn_end_id(tiny) == _id(tiny, "<|im_end|>")
    assert stop_token_ids(tiny) == sorted({_id(tiny, "<|im_end|>"), _id(tiny, "<|endoftext|>")})


def test_generation_config_eos_joins_the_stop_set(tiny):
    from types import SimpleNamespace

    start = _id(tiny, "<|im_start|>")
    assert stop_token_ids(tiny, SimpleNamespace(eos_token_id=[start])) == sorted({tiny.eos_token_id, start})
    assert stop_token_ids(tiny, SimpleNamespace(eos_token_id=None)) == [tiny.eos_token_id]


@pytest.mark.parametrize("turn_end, want", [
    ("<|endoftext|>\n", "<|endoftext|>"),  # a token followed by a newline
    (" <|endoftext|>", "<|endoftext|>"),  # Llama-2's " </s>": whitespace before the token
    ("<|endoftext|><|im_end|>\n", "<|endoftext|>"),  # several tokens: the answer is over at the first
    ("\n\n<|endoftext|>", "<|endoftext|>"),
])
def test_turn_ends_spelled_with_whitespace_or_several_tokens(tiny, turn_end, want):
    tiny.chat_template = _template(turn_end)
    assert turn_end_id(tiny) == _id(tiny, want)


def test_a_template_leaving_the_last_answer_open_is_read_from_the_next_turn(tiny):
    tiny.chat_template = _template("<|endoftext|>\n", last_open=True)
    assert turn_end_text(tiny) == "<|endoftext|>\n<|im_start|>user\n"
    assert turn_end_id(tiny) == _id(tiny, "<|endoftext|>")


def test_a_template_writing_only_a_newline_ends_the_turn_where_the_next_one_opens(tiny):
    tiny.chat_template = _template("\n")  # the model writes "\n<|im_start|>" after its answer
    assert turn_end_id(tiny) == _id(tiny, "<|im_start|>")


def test_qwen3_turn_end(qwen3_tokenizer):
    assert turn_end_id(qwen3_tokenizer) == qwen3_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert stop_token_ids(qwen3_tokenizer) == [qwen3_tokenizer.convert_tokens_to_ids("<|im_end|>")]


@pytest.mark.parametrize("kind", ["tiny-special", "qwen3-special"])
def test_answer_tags_as_special_tokens_are_never_stop_tokens(answer_tokenizers, kind):
    tok = answer_tokenizers[kind]
    tags = {_id(tok, t) for t in ANSWER_TAGS if len(tok(t, add_special_tokens=False)["input_ids"]) == 1}
    assert len(tags) >= 2
    assert turn_end_id(tok) == tok.convert_tokens_to_ids("<|im_end|>")
    assert not set(stop_token_ids(tok)) & tags


@pytest.mark.parametrize("spelling", ["stripping", "spaced"])
def test_answer_tags_spelled_with_surrounding_whitespace_are_never_stop_tokens(tiny, spelling):
    """Tags registered as special tokens with whitespace around them: tokens that take the whitespace next to
    them (``lstrip``/``rstrip``) or whose text holds it (``" </action> "``). With a template that writes such a
    tag before its turn end the stop would cut every action, and is refused; with the template's control token
    the tags stay out of the stop set."""
    if spelling == "stripping":
        tokens = [AddedToken(t, lstrip=True, rstrip=True, special=True) for t in ANSWER_TAGS]
    else:
        tokens = [AddedToken(f" {t} ", special=True, normalized=False) for t in ANSWER_TAGS]
    tiny.add_special_tokens({"additional_special_tokens": tokens})
    tags = {_id(tiny, " </action> "), _id(tiny, " <action> ")}
    assert {tiny.convert_ids_to_tokens(i).strip() for i in tags} == {"<action>", "</action>"}
    tiny.chat_template = _template(" </action> <|endoftext|>\n")
    with pytest.raises(ValueError, match="answer tag"):
        turn_end_id(tiny)
    tiny.chat_template = _template(" <|endoftext|>\n")
    assert turn_end_id(tiny) == _id(tiny, "<|endoftext|>")
    assert not set(stop_token_ids(tiny)) & tags


@pytest.mark.parametrize("template, why", [
    (_template("###\n"), "'###'"),  # plain text: no token to stop at
    ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n\n' }}{% endfor %}", "'user:'"),  # no token
    ("{% for message in messages %}{{ message['content'] | lower }}{% endfor %}", "verbatim"),
    ("{{ raise_exception('only one user turn') }}", "only one user turn"),
])
def test_a_turn_end_that_cannot_be_derived_is_refused_in_one_line(tiny, template, why):
    tiny.chat_template = template
    with pytest.raises(ValueError, match="tokenizer.chat_template") as exc:
        stop_token_ids(tiny)
    assert why in str(exc.value) and "\n" not in str(exc.value)


def test_no_chat_template_is_refused(tiny):
    tiny.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        turn_end_id(tiny)
