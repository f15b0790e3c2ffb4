"""Both backends record the same text for the same token ids, and no answer's text becomes a control
token in the next prompt.

OpenRLHF's vLLM ``SamplingParams`` keep special tokens in ``RequestOutput.text``
(``skip_special_tokens=False``, never set by ``train_ray``); the local sampler and the CPU engine
decode with ``skip_special_tokens=True``. A stub engine returns vLLM-style text for scripted ids:
the first answer (no ``<action>`` block) emitted ``<|im_start|>``; its text is sent to the env and
shown in the next prompt's history.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
import torch

from progpo.agents.episode import EpisodeConfig, run_episodes
from progpo.agents.types import Generation, SamplingParams
from progpo.envs.local_pool import LocalEnvPool
from progpo.run.settings import EnvSettings, RolloutSettings
from progpo_tests.room_env import RoomEnv


def _answers(tok) -> list[list[int]]:
    """Token ids of the 3 scripted answers, each ending with EOS."""
    start = tok.convert_tokens_to_ids("<|im_start|>")
    eos = [tok.eos_token_id]
    text_ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    return [[start] + text_ids("I am lost") + eos,  # no action block: the text itself is sent
            text_ids("<think>x</think><action>look</action>") + eos,
            text_ids("<think>y</think>") + [start] + text_ids("<action>look</action>") + eos]


class VllmStyleEngine:
    """OpenRLHF's engine actor as the agent executor sees it: ``RequestOutput.text`` keeps special tokens."""

    def __init__(self, tok) -> None:
        self.tok, self.answers, self.calls = tok, _answers(tok), 0

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        ids = self.answers[self.calls]
        self.calls += 1
        out = SimpleNamespace(token_ids=ids, text=self.tok.decode(ids, skip_special_tokens=False),
                              logprobs=[{t: SimpleNamespace(logprob=-1.0)} for t in ids], finish_reason="stop")
        return SimpleNamespace(outputs=[out])


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from progpo.run.tiny_model import tiny_model_path

    return AutoTokenizer.from_pretrained(str(tiny_model_path()))


def _control_ids(tok, ids) -> int:
    control = {tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")}
    return sum(i in control for i in ids)


def test_both_backends_record_the_same_text_and_prompts(cpu_compat, tok):
    with cpu_compat.import_shims():
        from progpo.openrlhf import agent

        params = cpu_compat.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=32, logprobs=1)
    executor = agent.AgentExecutor(agent.AgentConfig(env=EnvSettings(name="alfworld", pool="local", max_steps=3)),
                                   env_pool=LocalEnvPool(RoomEnv, max_envs=1))
    response = asyncio.run(executor.execute(json.dumps({"split": "train", "index": 0}), "train:0", params, 1024, tok,
                                            VllmStyleEngine(tok)))
    cluster = response[agent.RESPONSE_EPISODE_KEY]

    answers = iter(_answers(tok))

    async def local_generate(prompt_ids, sampling: SamplingParams) -> Generation:  # the local sampler's text
        ids = next(answers)
        return Generation(ids, [-1.0] * len(ids), tok.decode(ids, skip_special_tokens=True), "stop")

    cfg = EpisodeConfig(env=EnvSettings(name="alfworld", max_steps=3), rollout=RolloutSettings(max_prompt_tokens=1024 - 32),
                        sampling=SamplingParams(max_new_tokens=32))
    (local,) = asyncio.run(run_episodes([("train", 0)], cfg, env_pool=LocalEnvPool(RoomEnv, max_envs=1),
                                        generate=local_generate, tokenizer=tok))
    assert [s.response_text for s in cluster.steps] == [s.response_text for s in local.steps] == [
        "I am lost", "<think>x</think><action>look</action>", "<think>y</think><action>look</action>"]
    assert [s.action for s in cluster.steps] == [s.action for s in local.steps] == ["I am lost", "look", "look"]
    assert [s.format_invalid for s in cluster.steps] == [True, False, False]
    assert [s.prompt_ids for s in cluster.steps] == [s.prompt_ids for s in local.steps]
    # the next prompts show the earlier answers as plain text: the template's 3 control ids only
    assert [_control_ids(tok, s.prompt_ids) for s in cluster.steps] == [3, 3, 3]


# ----- what the model writes, the parser sees: both backends, tags as text and as special tokens (issue 34)
SCRIPTED_ANSWER = "<think>the room is dark, café ☕</think><action>look</action>"


class ScriptedLM(torch.nn.Module):
    """A causal LM that writes ``script`` (token ids) after any prompt: the wrapped model runs as the
    generator drives it (prefill, KV cache, positions) and its next-token logits are replaced by a choice of
    the next scripted id (``-1e4`` elsewhere), so any sampler picks it."""

    def __init__(self, model, script: list[int]) -> None:
        super().__init__()
        self.inner, self.script, self.t = model, list(script), 0
        self.generation_config = model.generation_config

    def forward(self, input_ids, past_key_values=None, **kwargs):
        out = self.inner(input_ids=input_ids, past_key_values=past_key_values, **kwargs)
        self.t = 0 if past_key_values is None else self.t + 1  # a prefill starts the answer over
        logits = torch.full_like(out.logits, -1e4)
        logits[..., self.script[min(self.t, len(self.script) - 1)]] = 0.0
        out.logits = logits
        return out


@pytest.fixture(scope="module", params=["tiny", "tiny-special"])
def scripted_folder(request, answer_tokenizers, tmp_path_factory):
    """The tiny model and one of the two tokenizers (answer tags as text / as special tokens) saved as an HF
    folder, its embeddings grown to the tokenizer (as an SFT recipe that adds tokens does)."""
    from transformers import AutoModelForCausalLM

    from progpo.run.tiny_model import save_model_folder, tiny_model_path

    tok = answer_tokenizers[request.param]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path()), dtype=torch.float32)
    model.resize_token_embeddings(len(tok))
    return save_model_folder(model, tok, tmp_path_factory.mktemp("scripted") / request.param)


def _check_steps(steps, tok) -> None:
    assert [s.response_text for s in steps] == [SCRIPTED_ANSWER] * 3
    assert [s.action for s in steps] == ["look"] * 3
    assert not any(s.format_invalid for s in steps)
    assert steps[0].response_ids == tok(SCRIPTED_ANSWER, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def test_local_backend_parser_sees_what_the_model_wrote(scripted_folder):
    """The local backend: ``HFGenerator`` (transformers forward passes) + the episode loop."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from progpo.run.generation import HFGenerator

    tok = AutoTokenizer.from_pretrained(str(scripted_folder))
    script = tok(SCRIPTED_ANSWER, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    model = ScriptedLM(AutoModelForCausalLM.from_pretrained(str(scripted_folder)), script)
    gen = HFGenerator(model, tok, seed=0)
    cfg = EpisodeConfig(env=EnvSettings(name="alfworld", max_steps=3), rollout=RolloutSettings(max_prompt_tokens=1024 - 64),
                        sampling=SamplingParams(max_new_tokens=64))
    (ep,) = asyncio.run(run_episodes([("train", 0)], cfg, env_pool=LocalEnvPool(RoomEnv, max_envs=1), generate=gen,
                                     tokenizer=tok))
    _check_steps(ep.steps, tok)


def test_openrlhf_cpu_engine_parser_sees_what_the_model_wrote(cpu_compat, scripted_folder):
    """The OpenRLHF path: our agent executor driving the CPU engine actor (``CPURolloutActor``, the stand-in
    of OpenRLHF's vLLM engine) loaded from the same folder, with the actor's tokenizer."""
    from transformers import AutoTokenizer

    with cpu_compat.import_shims():
        from progpo.openrlhf import agent
        from progpo.openrlhf.cpu import engine as cpu_engine

        params = cpu_compat.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=64, logprobs=1)
    tok = AutoTokenizer.from_pretrained(str(scripted_folder))
    script = tok(SCRIPTED_ANSWER, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    async def main():
        cls = cpu_engine.CPURolloutActor.__ray_actor_class__
        eng = cls.__new__(cls)
        await eng.__init__(str(scripted_folder), seed=3, dtype="fp32", max_model_len=1024)
        eng.generator.model = ScriptedLM(eng.model, script)
        executor = agent.AgentExecutor(agent.AgentConfig(env=EnvSettings(name="alfworld", pool="local", max_steps=3)),
                                       env_pool=LocalEnvPool(RoomEnv, max_envs=1))
        return await executor.execute(json.dumps({"split": "train", "index": 0}), "train:0", params, 1024, tok, eng)

    response = asyncio.run(main())
    _check_steps(response[agent.RESPONSE_EPISODE_KEY].steps, tok)


# ----- answers stop at the chat template's turn end, where it differs from EOS (issue 44, item 4) -----------
TURN_ENDS = {  # name: (eos_token, the template's turn end, answer tags registered as special tokens or not)
    "eos im_end, turn end endoftext": ("<|im_end|>", "<|endoftext|>", False),
    "eos endoftext, turn end im_end": ("<|endoftext|>", "<|im_end|>", False),
    "tags special with whitespace": ("<|im_end|>", "<|endoftext|>", True),
}


@pytest.fixture(scope="module", params=sorted(TURN_ENDS))
def turn_end_folder(request, answer_tokenizers, tmp_path_factory):
    """The tiny model with a tokenizer whose eos and chat-template turn end differ (the checkpoint's
    ``generation_config`` eos is the tokenizer's), in one direction or the other; in the third, the answer tags
    are special tokens that take the whitespace around them (``lstrip``/``rstrip``)."""
    import copy

    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM

    from progpo.agents.parsing import ANSWER_TAGS
    from progpo.run.tiny_model import CHATML_TEMPLATE, save_model_folder, tiny_model_path

    eos, turn_end, special_tags = TURN_ENDS[request.param]
    tok = copy.deepcopy(answer_tokenizers["tiny"])
    if special_tags:
        tok.add_special_tokens({"additional_special_tokens": [AddedToken(t, lstrip=True, rstrip=True, special=True)
                                                              for t in ANSWER_TAGS]})
    tok.eos_token = eos
    tok.chat_template = CHATML_TEMPLATE.replace("<|im_end|>", turn_end)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path()), dtype=torch.float32)
    model.resize_token_embeddings(len(tok))
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    return save_model_folder(model, tok, tmp_path_factory.mktemp("turn-end") / request.param.replace(" ", "-"))


def _turn_end_script(tok) -> tuple[list[int], list[int]]:
    """``(script, answer)``: the scripted answer, the template's turn end, then text the model would go on
    writing (another turn); ``answer`` is what a response must be: the answer and its turn end."""
    text_ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    turn_end = tok.convert_tokens_to_ids(({"<|im_end|>", "<|endoftext|>"} - {tok.eos_token}).pop())
    answer = text_ids(SCRIPTED_ANSWER) + [turn_end]
    return answer + text_ids("\n<|im_start|>user\ngo on, look again and again"), answer


def _check_stopped_at_turn_end(steps, tok, answer) -> None:
    assert [s.finish_reason for s in steps] == ["stop"] * 3  # before: "length", every answer ran to the limit
    assert [s.response_ids for s in steps] == [answer] * 3
    assert [s.response_text for s in steps] == [SCRIPTED_ANSWER] * 3
    assert [s.action for s in steps] == ["look"] * 3 and not any(s.format_invalid for s in steps)


def test_local_backend_stops_at_the_template_turn_end(turn_end_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from progpo.run.generation import HFGenerator

    tok = AutoTokenizer.from_pretrained(str(turn_end_folder))
    script, answer = _turn_end_script(tok)
    gen = HFGenerator(ScriptedLM(AutoModelForCausalLM.from_pretrained(str(turn_end_folder)), script), tok, seed=0)
    cfg = EpisodeConfig(env=EnvSettings(name="alfworld", max_steps=3), rollout=RolloutSettings(max_prompt_tokens=1024 - 64),
                        sampling=SamplingParams(max_new_tokens=64))
    (ep,) = asyncio.run(run_episodes([("train", 0)], cfg, env_pool=LocalEnvPool(RoomEnv, max_envs=1), generate=gen,
                                     tokenizer=tok))
    _check_stopped_at_turn_end(ep.steps, tok, answer)


def test_openrlhf_requests_carry_the_turn_end_and_the_cpu_engine_stops_there(cpu_compat, turn_end_folder):
    """The executor sends the tokenizer's stop set as ``stop_token_ids`` on every vLLM request (vLLM stops at EOS
    only), and the CPU engine honours a request's ``stop_token_ids``: here its own stop set is EOS alone."""
    from transformers import AutoTokenizer

    with cpu_compat.import_shims():
        from progpo.openrlhf import agent
        from progpo.openrlhf.cpu import engine as cpu_engine

        params = cpu_compat.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=64, logprobs=1)
    tok = AutoTokenizer.from_pretrained(str(turn_end_folder))
    script, answer = _turn_end_script(tok)
    sent = []

    async def main():
        cls = cpu_engine.CPURolloutActor.__ray_actor_class__
        eng = cls.__new__(cls)
        await eng.__init__(str(turn_end_folder), seed=3, dtype="fp32", max_model_len=1024)
        eng.generator.model = ScriptedLM(eng.model, script)
        eng.generator.eos_ids = [tok.eos_token_id]  # the engine alone would not stop at the turn end
        generate = eng.generate

        async def recording(prompt_token_ids, sampling_params, multi_modal_data=None):
            sent.append(list(sampling_params.stop_token_ids))
            return await generate(prompt_token_ids, sampling_params, multi_modal_data)

        eng.generate = recording
        executor = agent.AgentExecutor(agent.AgentConfig(env=EnvSettings(name="alfworld", pool="local", max_steps=3)),
                                       env_pool=LocalEnvPool(RoomEnv, max_envs=1))
        return await executor.execute(json.dumps({"split": "train", "index": 0}), "train:0", params, 1024, tok, eng)

    response = asyncio.run(main())
    assert sent == [sorted({tok.eos_token_id, answer[-1]})] * 3
    _check_stopped_at_turn_end(response[agent.RESPONSE_EPISODE_KEY].steps, tok, answer)
