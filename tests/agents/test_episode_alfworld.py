"""The episode loop on real ALFWorld games (shared data), driven by the games' expert walkthroughs."""

from __future__ import annotations

import asyncio
import functools
import json
import re

import pytest

from progpo.agents.batching import episodes_to_step_batch, rollout_metrics
from progpo.agents.episode import EpisodeConfig, run_episodes
from progpo.agents.scripted import ScriptedGenerate
from progpo.agents.types import SamplingParams
from progpo.envs.local_pool import LocalEnvPool
from progpo.run.settings import EnvSettings, RolloutSettings

alfworld = pytest.importorskip("progpo.envs.alfworld")

SPLIT = "valid_seen"
TASKS = [(SPLIT, 0), (SPLIT, 1)]


@pytest.fixture(scope="module")
def walkthroughs(shared_data) -> dict[str, list[str]]:
    """task text -> expert walkthrough, for the games of ``TASKS`` (read from the game files)."""
    env = alfworld.AlfWorldEnv()
    out = {}
    for split, index in TASKS:
        _, info = env.reset(split=split, index=index)
        with open(info["game_file"]) as f:
            out[info["task"]] = json.load(f)["walkthrough"]
    env.close()
    assert len(out) == len(TASKS), "the two test games must have different task texts"
    return out


def expert_policy(walkthroughs: dict[str, list[str]], bad_step: int | None = None):
    """Answer the walkthrough's command for the prompt's step (1-based); malformed at ``bad_step``."""

    def policy(prompt: str) -> str:
        task = re.search(r"Your task is to: (.*)", prompt).group(1).strip()
        m = re.search(r"You are now at step (\d+)", prompt)
        step = int(m.group(1)) if m else 1
        if step == bad_step:
            return "hmm, no tags here"
        plan = walkthroughs[task]
        offset = 1 if bad_step is not None and step > bad_step else 0
        return f"<think>following the plan</think><action>{plan[step - 1 - offset]}</action>"

    return policy


def _play(tokenizer, policy, max_steps, n=2):
    pool = LocalEnvPool(functools.partial(alfworld.AlfWorldEnv, max_steps=max_steps), max_envs=4)
    gen = ScriptedGenerate(tokenizer, policy)

    async def go():
        try:
            cfg = EpisodeConfig(env=EnvSettings(name="alfworld", max_steps=max_steps, history_length=2),
                                rollout=RolloutSettings(max_prompt_tokens=2048),
                                sampling=SamplingParams(max_new_tokens=128, seed=1), n_samples_per_task=n)
            return await run_episodes(TASKS, cfg, env_pool=pool, generate=gen, tokenizer=tokenizer)
        finally:
            await pool.close()

    return asyncio.run(go())


def test_expert_walkthrough_wins_real_games(qwen3_tokenizer, walkthroughs) -> None:
    longest = max(len(w) for w in walkthroughs.values())
    episodes = _play(qwen3_tokenizer, expert_policy(walkthroughs, bad_step=2), max_steps=longest + 3)
    assert len(episodes) == 4 and not any(ep.failed for ep in episodes)
    for ep in episodes:
        plan = walkthroughs[ep.steps[0].prompt_ids and _task_of(qwen3_tokenizer, ep)]
        assert ep.won, f"expert plan did not win {ep.task_id}"
        assert len(ep.steps) == len(plan) + 1  # one wasted (malformed) step
        bad = ep.steps[1]
        assert bad.format_invalid and bad.reward == pytest.approx(-0.1)
        assert ep.steps[-1].terminated and ep.steps[-1].env_reward == 10.0
        assert ep.episode_return == pytest.approx(10.0 - 0.1)
        assert ep.info["task_type"] in {"Pick", "Look", "Clean", "Heat", "Cool", "Pick2"}
        assert all(s.state_extra and s.state_extra.startswith("You ") for s in ep.steps)
        assert ep.steps[0].anchor_obs.startswith("You are in the middle of a room")
    # the two rollouts of a game play identically here, so their exact prompts coincide step by step
    for a, b in ((episodes[0], episodes[1]), (episodes[2], episodes[3])):
        assert a.uid == b.uid and [s.prefix_key for s in a.steps] == [s.prefix_key for s in b.steps]
    assert episodes[0].uid != episodes[2].uid
    batch = episodes_to_step_batch(episodes)
    assert batch.num_steps == sum(len(ep.steps) for ep in episodes)
    # the inventory (info["state_extra"]) reaches the StepBatch row by row; the expert picks objects up
    assert batch.state_extra.tolist() == [s.state_extra for ep in episodes for s in ep.steps]
    assert any(x.startswith("You are carrying: ") for x in batch.state_extra)
    m = rollout_metrics(episodes)
    assert m["env/success_rate"] == 1.0 and m["rollout/prompt_len_max"] <= 2048


def test_step_limit_truncates_real_games(qwen3_tokenizer, walkthroughs) -> None:
    episodes = _play(qwen3_tokenizer, lambda p: "<think>x</think><action>look</action>", max_steps=3, n=1)
    for ep in episodes:
        assert not ep.won and len(ep.steps) == 3
        assert [s.truncated for s in ep.steps] == [False, False, True]
        assert not any(s.format_invalid for s in ep.steps)


def _task_of(tokenizer, ep) -> str:
    prompt = tokenizer.decode(ep.steps[0].prompt_ids)
    return re.search(r"Your task is to: (.*)", prompt).group(1).strip()
