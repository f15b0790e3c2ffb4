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

from progpo.agents.episode import run_episodes
from progpo.agents.types import Generation, SamplingParams
from progpo.envs.base import StepResult
from progpo.envs.local_pool import LocalEnvPool
from progpo.run.settings import EnvSettings


class RoomEnv:
    """One room; ``look`` is the only admissible action; three steps end the episode."""

    def __init__(self, **_: object) -> None:
        self.t = 0

    def _info(self, invalid: bool = False) -> dict:
        return {"task": "look around", "task_id": "room", "anchor_observation": "You are in a room.",
                "admissible_actions": ["look"], "won": False, "invalid_action": invalid}

    def reset(self, *, split: str, index: int | None = None, seed: int | None = None):
        self.t = 0
        return "You are in a room.", self._info()

    def step(self, action: str) -> StepResult:
        self.t += 1
        return StepResult("You are in a room.", 0.0, False, self.t >= 3, self._info(action != "look"))

    def close(self) -> None:
        pass


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

    (local,) = asyncio.run(run_episodes([("train", 0)], env_pool=LocalEnvPool(RoomEnv, max_envs=1),
                                        generate=local_generate, tokenizer=tok, env_name="alfworld",
                                        n_samples_per_task=1, sampling=SamplingParams(max_new_tokens=32),
                                        max_steps=3, max_prompt_tokens=1024 - 32))
    assert [s.response_text for s in cluster.steps] == [s.response_text for s in local.steps] == [
        "I am lost", "<think>x</think><action>look</action>", "<think>y</think><action>look</action>"]
    assert [s.action for s in cluster.steps] == [s.action for s in local.steps] == ["I am lost", "look", "look"]
    assert [s.format_invalid for s in cluster.steps] == [True, False, False]
    assert [s.prompt_ids for s in cluster.steps] == [s.prompt_ids for s in local.steps]
    # the next prompts show the earlier answers as plain text: the template's 3 control ids only
    assert [_control_ids(tok, s.prompt_ids) for s in cluster.steps] == [3, 3, 3]
