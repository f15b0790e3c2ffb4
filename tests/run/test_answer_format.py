"""The start-up check refuses a tokenizer that would break the answer format, in one line that names the flag
and what to change, and accepts every tokenizer kind that carries it (tags as text, added or special tokens).

Tokenizers are built in code (nothing downloaded): variants of the tiny model's and Qwen3's.
"""

from __future__ import annotations

import copy

import pytest
from progpo.envs import env_ids
from progpo.run.answer_format import check_answer_format, check_model_answer_format
from progpo.run.tiny_model import CHATML_TEMPLATE

FLAG = "--actor.model_name_or_path"


@pytest.mark.parametrize("env_name", env_ids())
@pytest.mark.parametrize("kind", ["tiny", "tiny-special", "qwen3", "qwen3-special"])
def test_every_tokenizer_that_carries_the_format_is_accepted(answer_tokenizers, kind, env_name):
    check_answer_format(answer_tokenizers[kind], env_name, model=kind)


def test_a_tokenizer_that_cannot_write_the_tags_is_refused(uncased_tokenizer):
    with pytest.raises(ValueError) as err:
        check_answer_format(uncased_tokenizer, "alfworld", model="/models/bert-chat")
    msg = str(err.value)
    assert msg.startswith(f"{FLAG} /models/bert-chat: the answer ") and "\n" not in msg
    assert "decodes as '< think >" in msg and "tokenizer.add_tokens" in msg


@pytest.mark.parametrize("template, says", [
    (None, "no chat_template"),
    # drops the user's message (keeps system turns only)
    ("{% for m in messages %}{% if m['role'] == 'system' %}<|im_start|>system\n{{ m['content'] }}<|im_end|>\n"
     "{% endif %}{% endfor %}<|im_start|>assistant\n", "does not show every message content verbatim"),
    # rewrites it (upper case)
    ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | upper }}<|im_end|>\n{% endfor %}"
     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", "changes the message text"),
])
def test_a_chat_template_that_loses_the_prompt_is_refused(answer_tokenizers, template, says):
    tok = copy.deepcopy(answer_tokenizers["tiny"])
    tok.chat_template = template
    with pytest.raises(ValueError) as err:
        check_answer_format(tok, "webshop", model="m")
    msg = str(err.value)
    assert msg.startswith(f"{FLAG} m: ") and says in msg and "Set tokenizer.chat_template" in msg and "\n" not in msg


@pytest.mark.parametrize("prefill", ["<think>\n", "<think>\n\n</think>\n\n"])
def test_a_generation_prompt_that_opens_the_answer_is_refused(answer_tokenizers, prefill):
    """A reasoning model's template that prefills ``<think>``, or Qwen3's ``enable_thinking=False`` block."""
    tok = copy.deepcopy(answer_tokenizers["tiny-special"])
    tok.chat_template = CHATML_TEMPLATE.replace("'<|im_start|>assistant\n'", f"'<|im_start|>assistant\n{prefill}'")
    assert prefill in tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                              add_generation_prompt=True)
    with pytest.raises(ValueError) as err:
        check_answer_format(tok, "alfworld", model="m")
    assert "generation prompt" in str(err.value) and "already holds '<think>'" in str(err.value)


def test_the_model_folder_is_loaded_and_checked(tmp_path, answer_tokenizers, uncased_tokenizer):
    uncased_tokenizer.save_pretrained(tmp_path / "bad")
    answer_tokenizers["tiny-special"].save_pretrained(tmp_path / "good")
    check_model_answer_format(str(tmp_path / "good"), "webshop")
    with pytest.raises(ValueError, match=f"^{FLAG} {tmp_path / 'bad'}: the answer"):
        check_model_answer_format(str(tmp_path / "bad"), "webshop")
    with pytest.raises(ValueError, match=f"^{FLAG} {tmp_path / 'none'}: cannot load its tokenizer"):
        check_model_answer_format(str(tmp_path / "none"), "webshop")


@pytest.mark.parametrize("model, says", [("uncased_model", "the answer "),
                                         ("plain_turn_end_model", "the chat template ends an assistant turn with '###'")])
def test_local_train_refuses_it_at_start_up_in_one_line(tmp_path, capsys, request, model, says):
    """``python -m progpo.cli.train``: exit 2 before any env, service or model starts."""
    from progpo.cli.train import main

    folder = request.getfixturevalue(model)
    rc = main(["--actor.model_name_or_path", str(folder), "--env.name", "alfworld_like",
               "--ckpt.path", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith(f"error: {FLAG} {folder}: {says}")
    assert not (tmp_path / "run" / "config.json").exists()  # the actor was never built


def test_a_chat_template_whose_turn_end_cannot_be_stopped_at_is_refused(plain_turn_end_model):
    """Issue 44: the stop set holds the template's turn end (``progpo.agents.stop_tokens``); a turn end in plain
    text (no registered token) has none to stop at, so every answer would run to the token limit."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(plain_turn_end_model))
    with pytest.raises(ValueError) as err:
        check_answer_format(tok, "alfworld", model="m")
    msg = str(err.value)
    assert msg.startswith(f"{FLAG} m: the chat template ends an assistant turn with '###'") and "\n" not in msg
    assert "Set tokenizer.chat_template" in msg and "tokenizer.add_special_tokens" in msg
