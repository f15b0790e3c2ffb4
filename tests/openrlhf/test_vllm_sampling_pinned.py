"""vLLM requests sample from our ``SamplingParams`` only (issue 12, case 1, vLLM side).

vllm is not installed on CPU; the requests are checked on the import shim's ``SamplingParams``
(``progpo.openrlhf.cpu.shims``: real vLLM field names and defaults) that OpenRLHF's template is built from, and on the keyword arguments our
local ``VLLMGenerator`` hands to a recording fake ``vllm`` module. One test per distribution-changing
vLLM field: a template (or default) that sets it must not reach the request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.machinery
import sys
import types
from types import SimpleNamespace

import pytest

from progpo.agents.types import VLLM_NEUTRAL_SAMPLING, SamplingParams
from progpo.trainer.settings import DeepSpeedSettings

# a non-neutral value per field, as a checkpoint default or OpenRLHF's template could carry it
POLLUTED = {
    "top_k": 20,
    "min_p": 0.3,
    "presence_penalty": 1.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.1,
    "min_tokens": 1,  # OpenRLHF's template default (--rollout.min_new_tokens): no EOS at the first token
    "logit_bias": {5: 10.0},
    "allowed_token_ids": [1, 2, 3],
    "bad_words": ["click"],
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def agent_mod(cpu_compat):
    with cpu_compat.import_shims():
        from progpo.openrlhf import agent

    return agent


class _Engine:
    def __init__(self):
        self.params = []

    async def generate(self, prompt_token_ids, params):
        self.params.append(params)
        out = SimpleNamespace(token_ids=[7, 2], text="x", logprobs=[{7: SimpleNamespace(logprob=-0.5)},
                                                                       {2: SimpleNamespace(logprob=-0.1)}],
                              finish_reason="stop")
        return SimpleNamespace(outputs=[out])


def test_every_pinned_field_is_a_vllm_field(cpu_compat):
    names = {f.name for f in dataclasses.fields(cpu_compat.SamplingParams)}
    assert set(POLLUTED) == set(VLLM_NEUTRAL_SAMPLING)
    assert set(SamplingParams().vllm_kwargs()) <= names
    defaults = cpu_compat.SamplingParams()
    assert all(getattr(defaults, k) == v for k, v in VLLM_NEUTRAL_SAMPLING.items())  # neutral = vLLM's own default


@pytest.mark.parametrize("field", sorted(POLLUTED))
def test_openrlhf_template_field_does_not_reach_the_request(agent_mod, cpu_compat, field):
    template = cpu_compat.SamplingParams(temperature=0.7, top_p=0.9, max_tokens=64, skip_special_tokens=False)
    setattr(template, field, POLLUTED[field])
    engine = _Engine()
    gen = agent_mod.EngineGenerate(engine, template)
    g = asyncio.run(gen([1, 2, 3], SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=32, seed=4)))
    sent = engine.params[0]
    assert getattr(sent, field) == VLLM_NEUTRAL_SAMPLING[field]
    assert (sent.temperature, sent.top_p, sent.max_tokens, sent.seed, sent.logprobs) == (1.0, 0.95, 32, 4, 1)
    assert sent.skip_special_tokens is False  # non-sampling template fields are kept
    assert getattr(template, field) == POLLUTED[field]  # the shared template is not mutated
    assert g.logprobs == [-0.5, -0.1]


@pytest.fixture
def fake_vllm(monkeypatch) -> dict:
    """A recording ``vllm`` module: ``calls["engine"]`` the ``LLM`` keyword arguments, ``calls["params"]`` the
    last ``generate``'s sampling parameters (dicts); every answer runs to its ``max_tokens``."""
    calls = {}

    class LLM:
        def __init__(self, **kwargs):
            calls["engine"] = kwargs

        def generate(self, prompts, params, use_tqdm=False):
            calls["params"] = params
            outs = []
            for p in params:
                n = p["max_tokens"]
                c = SimpleNamespace(token_ids=[9] * n, text="y" * n, finish_reason="length",
                                    logprobs=[{9: SimpleNamespace(logprob=-1.0)}] * n)
                outs.append(SimpleNamespace(outputs=[c]))
            return outs

    fake = types.ModuleType("vllm")
    fake.LLM = LLM
    fake.SamplingParams = lambda **kw: kw
    fake.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # importlib.util.find_spec finds it
    fake_inputs = types.ModuleType("vllm.inputs")
    fake_inputs.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", fake_inputs)
    return calls


def test_local_vllm_generator_pins_fields_and_ignores_checkpoint_defaults(fake_vllm):
    """``--rollout.backend vllm``: every request carries the neutral fields; the engine ignores
    ``generation_config.json`` and reports temperature-scaled (processed) log-probs."""
    from progpo.trainer.rollout_backend import VLLMGenerator

    calls = fake_vllm
    gen = VLLMGenerator("/no/model", seed=3, stop_token_ids=(7, 5))
    assert calls["engine"]["generation_config"] == "vllm"
    assert calls["engine"]["logprobs_mode"] == "processed_logprobs"
    g = asyncio.run(gen([1, 2], SamplingParams(temperature=0.8, max_new_tokens=5, stop_token_ids=(6,))))
    (sent,) = calls["params"]
    for name, value in VLLM_NEUTRAL_SAMPLING.items():
        assert sent[name] == value, name
    assert (sent["temperature"], sent["max_tokens"], sent["seed"], sent["logprobs"]) == (0.8, 5, 3, 0)
    assert sent["stop_token_ids"] == [5, 6, 7]  # the generator's stop set and the request's own
    assert g.finish_reason == "length" and g.logprobs == [-1.0] * 5


def test_local_vllm_backend_stops_at_the_chat_template_turn_end(fake_vllm, answer_tokenizers):
    """Issue 44: the engine stops at the tokenizer's EOS only (and ignores ``generation_config.json``), so
    ``make_generator`` hands it the actor's stop set: EOS, the checkpoint's EOS and the template's turn end."""
    import copy

    from progpo.run.tiny_model import CHATML_TEMPLATE
    from progpo.trainer.rollout_backend import make_generator

    tok = copy.deepcopy(answer_tokenizers["tiny"])
    tok.chat_template = CHATML_TEMPLATE.replace("<|im_end|>", "<|endoftext|>")  # eos stays <|im_end|>
    im_start, im_end, endoftext = (tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    actor = SimpleNamespace(cfg=SimpleNamespace(actor=SimpleNamespace(model_name_or_path="/no/model"), ds=DeepSpeedSettings()),
                            tokenizer=tok,
                            model=SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[im_start])))
    gen = make_generator(SimpleNamespace(backend="vllm"), actor, seed=1)
    asyncio.run(gen([1, 2], SamplingParams(max_new_tokens=3)))
    assert fake_vllm["params"][0]["stop_token_ids"] == sorted({im_end, endoftext, im_start})
