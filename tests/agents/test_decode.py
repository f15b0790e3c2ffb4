"""What the model writes, the parser sees: ``decode_response`` keeps the answer tags whatever kind of token
the tokenizer makes of them (ordinary text, added token, special token) and drops only control tokens.

Issue 34: a tokenizer with the tags registered as special tokens lost them (``skip_special_tokens=True``),
so the parser saw ``the mug is heretake mug 1 from countertop 1`` and every answer was invalid.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from progpo.agents.parsing import ANSWER_TAGS, parse_action
from progpo.agents.templates import control_token_ids, decode_response, encode_text

KINDS = ["tiny", "tiny-special", "qwen3", "qwen3-special"]
ANSWER = "<think>the mug is here</think><action>take mug 1 from countertop 1</action>"


def written(tok, answer: str) -> list[int]:
    """The ids a model writes for ``answer`` (each tag as the tokenizer tokenizes it: one id when it is a
    registered token) followed by its EOS."""
    return tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def test_the_tokenizers_hold_the_tags_as_their_names_say(answer_tokenizers):
    def kind(tok, tag):
        ids = tok(tag, add_special_tokens=False)["input_ids"]
        if len(ids) > 1:
            return "text"
        return "special" if tok.added_tokens_decoder[ids[0]].special else "added"

    got = {name: [kind(tok, t) for t in ANSWER_TAGS] for name, tok in answer_tokenizers.items()}
    assert got == {"tiny": ["text"] * 4, "tiny-special": ["special"] * 4,
                   "qwen3": ["added", "added", "text", "text"], "qwen3-special": ["added", "added", "special", "special"]}


@pytest.mark.parametrize("kind", KINDS)
def test_reported_answer_reaches_the_parser_whole(answer_tokenizers, kind):
    tok = answer_tokenizers[kind]
    text = decode_response(tok, written(tok, ANSWER))
    assert text == ANSWER  # was "the mug is heretake mug 1 from countertop 1" with special tags
    assert parse_action(text, "alfworld") == ("take mug 1 from countertop 1", True)


@pytest.mark.parametrize("kind", KINDS)
def test_control_tokens_are_dropped_and_only_them(answer_tokenizers, kind):
    tok = answer_tokenizers[kind]
    drop = control_token_ids(tok)
    named = {tok.eos_token_id, tok.pad_token_id, tok.convert_tokens_to_ids("<|im_start|>")}
    assert named <= drop
    tag_ids = {i for t in ANSWER_TAGS for i in tok(t, add_special_tokens=False)["input_ids"]}
    assert not drop & tag_ids
    # what skip_special_tokens drops, but the tags
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special} | set(tok.all_special_ids)
    assert drop == special - tag_ids


_PIECE = st.one_of(
    st.tuples(st.just("text"), st.text(max_size=12)),  # any Unicode, a control token's spelling included
    st.tuples(st.just("text"), st.sampled_from(["<|im_end|>", "<THINK>", "</action >", "米", "e\u0301", "🍵"])),
    st.tuples(st.just("tag"), st.sampled_from(ANSWER_TAGS)),
    st.tuples(st.just("control"), st.sampled_from(["eos", "pad", "<|im_start|>"])),
)


@pytest.mark.parametrize("kind", KINDS)
@given(pieces=st.lists(_PIECE, max_size=10))
def test_decoded_text_is_what_the_model_wrote(answer_tokenizers, kind, pieces):
    """A response made of text (written as plain-text tokens), answer tags (written as the tokenizer makes
    them) and control tokens: the decoded text is the text and tags in order, the control tokens gone."""
    tok = answer_tokenizers[kind]
    ids: list[int] = []
    want = ""
    for what, value in pieces:
        if what == "text":
            piece = encode_text(tok, value)
            want += tok.decode(piece, skip_special_tokens=False)  # the text of those ids (NFC for Qwen's)
        elif what == "tag":
            piece = tok(value, add_special_tokens=False)["input_ids"]
            want += value
        else:
            piece = [{"eos": tok.eos_token_id, "pad": tok.pad_token_id}.get(value) or tok.convert_tokens_to_ids(value)]
        ids += piece
    assert decode_response(tok, ids) == want


@pytest.mark.parametrize("kind", ["tiny", "qwen3"])
@given(data=st.data())
def test_ordinary_tags_decode_as_before(answer_tokenizers, kind, data):
    """Where no answer tag is a special token, the rule is ``skip_special_tokens=True``'s on any ids."""
    tok = answer_tokenizers[kind]
    ids = data.draw(st.lists(st.one_of(st.integers(0, len(tok) - 1), st.sampled_from(sorted(control_token_ids(tok)))),
                             max_size=20))
    assert decode_response(tok, ids) == tok.decode(ids, skip_special_tokens=True)
