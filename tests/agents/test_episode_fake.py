"""The async episode loop with a scripted generate and the in-process fake env."""

from __future__ import annotations

import asyncio
import functools
import re

import numpy as np
import pytest

from progpo.agents.batching import episodes_to_step_batch, rollout_metrics, training_steps
from progpo.agents.episode import EpisodeConfig, run_episodes, step_seed
from progpo.agents.scripted import ScriptedGenerate
from progpo.agents.templates import build_prompt
from progpo.agents.types import SamplingParams
from progpo.envs.alfworld import ALFWORLD_TEMPLATE
from progpo.envs.local_pool import LocalEnvPool
from progpo.run.settings import EnvSettings, RolloutSettings
from progpo_tests.patience import PATIENCE_S

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=64, seed=7)


def forward_policy(env_style: str, bad_at_step: int | None = None):
    """Always move forward; answer without tags at prompt step ``bad_at_step`` (1-based)."""
    forward = "click[forward]" if env_style == "webshop" else "go to door 1"

    def policy(prompt: str) -> str:
        m = re.search(r"You are now at step (\d+)", prompt)
        step = int(m.group(1)) if m else 1
        if bad_at_step is not None and step == bad_at_step:
            return "I will just go forward"
        return f"<think>the goal is ahead</think><action>{forward}</action>"

    return policy


def _run(tokenizer, env_cls, *, style="alfworld", tasks=(("train", 0), ("train", 1)), n=3,
         policy=None, max_steps=8, env_max_steps=None, env_kwargs=None, history_length=2, invalid_penalty=0.1,
         max_prompt_tokens=None, **kw):
    pool = LocalEnvPool(functools.partial(env_cls, style=style, max_steps=env_max_steps or max_steps,
                                          **(env_kwargs or {})),
                        max_envs=16)
    gen = ScriptedGenerate(tokenizer, policy or forward_policy(style))
    env = EnvSettings(name=style, max_steps=max_steps, history_length=history_length, invalid_penalty=invalid_penalty)
    cfg = EpisodeConfig(env=env, rollout=RolloutSettings(max_prompt_tokens=max_prompt_tokens), sampling=SAMPLING,
                        n_samples_per_task=n, **kw)
    episodes = asyncio.run(run_episodes(list(tasks), cfg, env_pool=pool, generate=gen, tokenizer=tokenizer))
    asyncio.run(pool.close())
    return episodes, gen


def test_groups_steps_and_records(qwen3_tokenizer, fake_env_cls) -> None:
    episodes, gen = _run(qwen3_tokenizer, fake_env_cls)
    assert len(episodes) == 6
    assert [ep.uid for ep in episodes] == ["train:0"] * 3 + ["train:1"] * 3
    assert [ep.traj_id for ep in episodes] == list(range(6))
    for ep in episodes:
        goal = 2 + ep.task_index % 3
        assert not ep.failed and ep.won and len(ep.steps) == goal
        assert ep.task_id == f"train-{ep.task_index}"
        assert ep.info["task_type"] == "corridor" and "admissible_actions" not in ep.info
        assert [s.reward for s in ep.steps] == [0.0] * (goal - 1) + [10.0]
        assert [s.terminated for s in ep.steps] == [False] * (goal - 1) + [True]
        assert not any(s.truncated or s.invalid for s in ep.steps)

        assert [s.anchor_obs for s in ep.steps] == [f"You are in room {k}." for k in range(goal)]
        assert [s.state_extra for s in ep.steps] == [f"You carry {k} keys." for k in range(goal)]
        for s in ep.steps:
            assert s.action == "go to door 1"
            assert len(s.response_ids) == len(s.logprobs) > 0
            assert s.response_ids[-1] == qwen3_tokenizer.eos_token_id
            assert qwen3_tokenizer.decode(s.prompt_ids).endswith("<|im_start|>assistant\n")
    # same task, same history -> same exact prompt -> same prefix key; other tasks differ
    g0 = [[s.prefix_key for s in ep.steps] for ep in episodes[:3]]
    assert g0[0] == g0[1] == g0[2]
    assert episodes[0].steps[0].prefix_key != episodes[3].steps[0].prefix_key
    # the history window is K=2: step 3 shows steps 1-2 only (task 1 has goal 3)
    third = qwen3_tokenizer.decode(episodes[3].steps[2].prompt_ids)
    assert "Observation 1:" in third and "Observation 2:" in third and "step 3" in third
    # seeds differ per (trajectory, step), so the N rollouts of one prompt are not clones
    seeds = [c[1].seed for c in gen.calls]
    assert len(set(seeds)) == len(seeds) == sum(len(ep.steps) for ep in episodes)
    assert step_seed(7, 0, 0) != step_seed(7, 1, 0) and step_seed(None, 0, 0) is None


def test_invalid_format_is_sent_and_penalised(qwen3_tokenizer, fake_env_cls) -> None:
    episodes, _ = _run(qwen3_tokenizer, fake_env_cls, tasks=[("train", 0)], n=2,
                       policy=forward_policy("alfworld", bad_at_step=2), invalid_penalty=0.1)
    for ep in episodes:
        bad = ep.steps[1]
        assert bad.format_invalid and bad.invalid and bad.env_invalid  # env said "Nothing happens."
        assert bad.action == "I will just go forward"  # raw response sent, as the protocol does
        assert bad.env_reward == 0.0 and bad.reward == pytest.approx(-0.1)
        assert len(ep.steps) == 3 and ep.won  # one wasted step
        assert ep.episode_return == pytest.approx(10.0 - 0.1)


def test_env_invalid_penalty_is_optional(qwen3_tokenizer, fake_env_cls) -> None:
    def inadmissible(prompt: str) -> str:
        return "<think>x</think><action>open fridge 1</action>"  # one command, not admissible here

    eps, _ = _run(qwen3_tokenizer, fake_env_cls, tasks=[("train", 0)], n=1, policy=inadmissible, max_steps=2)
    assert all(s.env_invalid and not s.format_invalid and s.reward == 0.0 for s in eps[0].steps)
    eps, _ = _run(qwen3_tokenizer, fake_env_cls, tasks=[("train", 0)], n=1, policy=inadmissible, max_steps=2,
                  penalize_env_invalid=True, invalid_penalty=0.5)
    assert all(s.reward == pytest.approx(-0.5) for s in eps[0].steps)


def test_loop_step_limit_marks_truncated(qwen3_tokenizer, fake_env_cls) -> None:
    def look(prompt: str) -> str:
        return "<think>wait</think><action>search[room]</action>"

    # the loop's limit (3) is below the env's own (8): the loop marks the last step truncated
    episodes, _ = _run(qwen3_tokenizer, fake_env_cls, style="webshop", tasks=[("test", 2)], n=2, policy=look,
                       max_steps=3, env_max_steps=8)
    for ep in episodes:
        assert len(ep.steps) == 3 and not ep.won
        assert [s.truncated for s in ep.steps] == [False, False, True]
        assert not any(s.terminated for s in ep.steps)
        assert ep.steps[0].state_extra is None  # webshop-style env has no inventory
    # the env's own step limit also ends an episode as truncated
    eps, _ = _run(qwen3_tokenizer, fake_env_cls, tasks=[("train", 0)], n=1, max_steps=4, env_max_steps=1)
    assert len(eps[0].steps) == 1 and eps[0].steps[0].truncated and not eps[0].won


def test_failed_env_marks_only_its_episodes(qwen3_tokenizer, fake_env_cls) -> None:
    episodes, _ = _run(qwen3_tokenizer, fake_env_cls, tasks=[("train", 0), ("train", 1)], n=2,
                       env_kwargs={"fail_at_step": 2, "fail_indices": (1,)})
    assert [ep.failed for ep in episodes] == [False, False, True, True]
    assert all(ep.won for ep in episodes[:2])
    batch = episodes_to_step_batch(episodes)
    assert set(batch.uid.tolist()) == {"train:0"}
    assert batch.num_steps == sum(len(ep.steps) for ep in episodes[:2])
    metrics = rollout_metrics(episodes)
    assert metrics["env/failed_frac"] == 0.5 and metrics["env/success_rate"] == 1.0


def test_failed_reset_marks_episode_failed(qwen3_tokenizer, fake_env_cls) -> None:
    episodes, _ = _run(qwen3_tokenizer, fake_env_cls, tasks=[("train", 0), ("train", 1)], n=2,
                       env_kwargs={"fail_reset_indices": (0,)})
    assert [ep.failed for ep in episodes] == [True, True, False, False]
    assert all(not ep.steps for ep in episodes[:2]) and all(ep.won for ep in episodes[2:])
    with pytest.raises(ValueError, match="all 2 episodes failed"):
        episodes_to_step_batch(episodes[:2])


def test_episodes_run_concurrently_within_the_bound(qwen3_tokenizer, fake_env_cls) -> None:
    def measure(max_concurrency, target):
        """Peak number of generations in flight. The first ones wait (event, not a clock) until
        ``target`` are in flight at once, so a slow machine cannot serialise them by accident."""
        pool = LocalEnvPool(functools.partial(fake_env_cls, max_steps=8), max_envs=16)
        inner = ScriptedGenerate(qwen3_tokenizer, forward_policy("alfworld"))
        state = {"now": 0, "peak": 0}

        async def run():
            reached = asyncio.Event()

            async def gen(prompt_ids, sampling):
                state["now"] += 1
                state["peak"] = max(state["peak"], state["now"])
                if state["now"] >= target:
                    reached.set()
                await asyncio.wait_for(reached.wait(), PATIENCE_S)
                await asyncio.sleep(0.01)  # a backend that takes time: others may get in meanwhile
                state["now"] -= 1
                return await inner(prompt_ids, sampling)

            cfg = EpisodeConfig(env=EnvSettings(name="alfworld", max_steps=8), rollout=RolloutSettings(),
                                sampling=SAMPLING, n_samples_per_task=3, max_concurrency=max_concurrency)
            await run_episodes([("train", 0), ("train", 1)], cfg, env_pool=pool, generate=gen, tokenizer=qwen3_tokenizer)

        asyncio.run(run())
        return state["peak"]

    assert measure(None, target=3) >= 3  # unbounded: many of the 2 x 3 episodes in flight at once
    assert measure(2, target=2) == 2  # bounded: never more (a slow machine can only hide a breach)


def test_step_batch_rows_align_with_records(qwen3_tokenizer, fake_env_cls) -> None:
    episodes, _ = _run(qwen3_tokenizer, fake_env_cls, policy=forward_policy("alfworld", bad_at_step=1))
    batch = episodes_to_step_batch(episodes)
    records = training_steps(episodes)
    assert batch.num_steps == len(records)
    assert batch.prefix_key.tolist() == [r.prefix_key for r in records]
    assert np.allclose(batch.reward, [r.reward for r in records])
    assert batch.invalid.tolist() == [r.invalid for r in records]
    assert batch.state_extra is not None and batch.state_extra[0] == "You carry 0 keys."
    # ProGPO's product default keys its anchor states on it (state_key auto -> obs_inventory, issue 10)
    from progpo.advantages import AdvantageConfig
    from progpo.advantages._prep import prepare
    assert prepare(batch, AdvantageConfig()).cfg.state_key == "obs_inventory"
    steps = batch.step_index.tolist()
    assert steps[:3] == [0, 1, 2]
    with pytest.raises(ValueError, match="no training steps"):
        episodes_to_step_batch([])


def test_context_guard_inside_loop(qwen3_tokenizer, fake_env_cls, caplog) -> None:
    # room 0 prompt with no history: the guard limit leaves no space for history turns
    base = build_prompt(qwen3_tokenizer, ALFWORLD_TEMPLATE, task="reach room 4",
                        observation="You are in room 1.", admissible_actions=["go to door 1", "look"])
    limit = len(base.prompt_ids) + 10
    with caplog.at_level("INFO", logger="progpo.agents.episode"):
        episodes, _ = _run(qwen3_tokenizer, fake_env_cls, tasks=[("train", 2)], n=1, max_prompt_tokens=limit)
    assert "context guard shortened 3 of 4 prompts" in caplog.text
    ep = episodes[0]
    assert ep.won and len(ep.steps) == 4
    assert ep.steps[0].prompt_truncated_turns == 0
    assert all(s.prompt_truncated_turns >= 1 for s in ep.steps[1:])
    assert all(len(s.prompt_ids) <= limit for s in ep.steps)
    assert rollout_metrics(episodes)["rollout/guard_dropped_turns"] == sum(
        s.prompt_truncated_turns for s in ep.steps)


def test_bounded_concurrency_and_bad_arguments(qwen3_tokenizer, fake_env_cls) -> None:
    for bad, match in [({"n": 0}, "n_samples_per_task"), ({"max_steps": 0}, "max_steps"),
                       ({"history_length": -1}, "history_length"), ({"invalid_penalty": -1.0}, "invalid_penalty"),
                       ({"tasks": ["train"]}, "task")]:
        with pytest.raises(ValueError, match=match):
            _run(qwen3_tokenizer, fake_env_cls, **bad)


def test_truncated_step_carries_the_state_it_was_cut_in(qwen3_tokenizer, fake_env_cls) -> None:
    # task ("train", 1) needs 3 forward moves (goal room 3); the loop stops after 2, in room 2
    episodes, _ = _run(qwen3_tokenizer, fake_env_cls, tasks=[("train", 1)], n=1, max_steps=2)
    (ep,) = episodes
    assert [s.truncated for s in ep.steps] == [False, True] and not ep.won
    assert ep.final_obs == "You are in room 2."
    batch = episodes_to_step_batch(episodes)
    assert batch.final_obs.tolist() == ["", "You are in room 2."]
    # the graph estimator (E1) now sends that truncated step to its final observation's node
    from progpo.advantages import AdvantageConfig, compute_advantages

    out = compute_advantages(batch, AdvantageConfig(potential_estimator="graph", max_steps=2))
    assert np.all(np.isfinite(out.advantages))


def test_response_cut_at_token_limit_is_format_invalid(qwen3_tokenizer, fake_env_cls) -> None:
    """Issue 12, case 5: a response that closed </action> and then ran on to max_new_tokens is not a
    clean step: finish_reason "length", format-invalid (penalty charged), its action still sent."""
    answer = "<think>the goal is ahead</think><action>go to door 1</action>"
    rambling = answer + " and then I keep talking" * 40
    n_answer = len(qwen3_tokenizer(answer, add_special_tokens=False)["input_ids"])

    def policy(prompt: str) -> str:
        first = re.search(r"You are now at step (\d+)", prompt) is None  # step 1: the no-history template
        return rambling if first else answer  # the first response of every episode rambles

    episodes, _ = _run(qwen3_tokenizer, fake_env_cls, tasks=(("train", 0),), n=2, policy=policy)
    limit = SAMPLING.max_new_tokens
    assert n_answer < limit  # the action block closed well inside the limit
    for ep in episodes:
        cut, *rest = ep.steps
        assert cut.finish_reason == "length" and len(cut.response_ids) == limit
        assert "</action>" in cut.response_text
        assert cut.format_invalid and cut.invalid and not cut.env_invalid
        assert cut.reward == pytest.approx(-0.1)  # env reward 0 minus the invalid-action penalty
        assert cut.action == "go to door 1" and ep.won  # the action was sent: the agent moved
        assert all(s.finish_reason == "stop" and not s.format_invalid for s in rest)
    steps = [s for ep in episodes for s in ep.steps]
    m = rollout_metrics(episodes)
    assert m["rollout/truncated_response_frac"] == pytest.approx(2 / len(steps))
    assert m["rollout/invalid_format_frac"] == pytest.approx(2 / len(steps))


def test_unknown_finish_reason_is_an_error(qwen3_tokenizer, fake_env_cls) -> None:
    from progpo.agents.types import Generation

    async def gen(prompt_ids, sampling):
        return Generation(token_ids=[1], logprobs=[0.0], text="x", finish_reason="abort")

    pool = LocalEnvPool(functools.partial(fake_env_cls), max_envs=1)
    with pytest.raises(ValueError, match="finish_reason 'abort'"):
        cfg = EpisodeConfig(env=EnvSettings(name="alfworld", max_steps=2), rollout=RolloutSettings(), sampling=SAMPLING)
        asyncio.run(run_episodes([("train", 0)], cfg, env_pool=pool, generate=gen, tokenizer=qwen3_tokenizer))
    asyncio.run(pool.close())
