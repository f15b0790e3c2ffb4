"""The synthetic envs' small policy (progpo.run.agent_model): built from a config in code, keeps the
prompt protocol (ChatML, answer tags as single tokens), cached by config."""

from __future__ import annotations

import pytest

from progpo.run.agent_model import AgentModelConfig, agent_model_path, build_agent_tokenizer, synthetic_env_names

SMALL = AgentModelConfig(corpus_tasks=4)  # a small corpus: seconds to build


@pytest.fixture(scope="module")
def agent_dir(tmp_path_factory):
    return agent_model_path(SMALL, models_dir=tmp_path_factory.mktemp("models"))


def test_registry_names_the_synthetic_envs():
    assert synthetic_env_names() == ["alfworld_like", "webshop_like"]


def test_tokenizer_keeps_the_prompt_protocol(agent_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(agent_dir)
    answer = "<think>I go there.</think><action>go to diningtable 3</action>"
    pieces = tok.tokenize(answer)
    assert [p for p in pieces if "<" in p] == ["<think>", "</think>", "<action>", "</action>"]
    assert tok.decode(tok(answer)["input_ids"], skip_special_tokens=True) == answer
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_model_has_the_configured_size_and_is_cached(agent_dir, tmp_path):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(agent_dir)
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == ("qwen2", 64, 2, 256)
    assert agent_model_path(SMALL, models_dir=agent_dir.parent) == agent_dir  # built once, then found
    assert agent_model_path(AgentModelConfig(corpus_tasks=4, hidden_size=32, num_heads=2, num_kv_heads=1),
                            models_dir=agent_dir.parent) != agent_dir


@pytest.mark.parametrize("field, value", [("hidden_size", 0), ("num_heads", 3)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        AgentModelConfig(**{field: value})


def test_tokenizer_is_deterministic():
    a, b = build_agent_tokenizer(SMALL), build_agent_tokenizer(SMALL)
    assert a.get_vocab() == b.get_vocab()
