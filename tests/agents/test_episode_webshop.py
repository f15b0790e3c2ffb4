"""The episode loop on the real WebShop server (shared 87-product data) with a scripted shopper."""

from __future__ import annotations

import asyncio
import functools
import re

import pytest

from progpo.agents.batching import episodes_to_step_batch, rollout_metrics
from progpo.agents.episode import EpisodeConfig, run_episodes
from progpo.agents.scripted import ScriptedGenerate
from progpo.agents.types import SamplingParams
from progpo.envs.local_pool import LocalEnvPool
from progpo.run.settings import EnvSettings, RolloutSettings
from progpo_tests.patience import PATIENCE_S

webshop = pytest.importorskip("progpo.envs.webshop")

TASKS = [("train", 0), ("train", 1)]
ASIN = re.compile(r"^click\[b[0-9a-z]{9}\]$")


def shopper(admissible_parser, bad_at_step: int | None = None, buy: bool = True):
    """Search with the instruction's words, open the first product, buy it; malformed at ``bad_at_step``.

    ``buy=False`` goes back to search instead of buying (a browser that runs to ``max_steps``).
    """

    def policy(prompt: str) -> str:
        m = re.search(r"You are now at step (\d+)", prompt)
        step = int(m.group(1)) if m else 1
        if step == bad_at_step:
            return "<think>hmm</think> buy it"
        actions = admissible_parser(prompt)
        if "search[<your query>]" in actions:
            task = re.search(r"Your task is to: (.*?)\.?\n", prompt).group(1)
            action = f"search[{task}]"
        elif any(ASIN.match(a) for a in actions):
            action = next(a for a in actions if ASIN.match(a))
        elif buy and "click[buy now]" in actions:
            action = "click[buy now]"
        elif not buy and "click[back to search]" in actions:
            action = "click[back to search]"
        else:
            action = actions[0]
        return f"<think>step {step}</think><action>{action}</action>"

    return policy


def _play(tokenizer, url, policy, *, n=2, max_steps=6, max_prompt_tokens=4096):
    pool = LocalEnvPool(functools.partial(webshop.WebShopEnv, url, max_steps=15, timeout_s=PATIENCE_S), max_envs=8)
    gen = ScriptedGenerate(tokenizer, policy)

    async def go():
        try:
            cfg = EpisodeConfig(env=EnvSettings(name="webshop", max_steps=max_steps),
                                rollout=RolloutSettings(max_prompt_tokens=max_prompt_tokens),
                                sampling=SamplingParams(max_new_tokens=96, seed=3), n_samples_per_task=n)
            return await run_episodes(TASKS, cfg, env_pool=pool, generate=gen, tokenizer=tokenizer)
        finally:
            await pool.close()

    return asyncio.run(go())


def test_scripted_shopper_buys_on_real_server(qwen3_tokenizer, webshop_url, admissible_parser) -> None:
    episodes = _play(qwen3_tokenizer, webshop_url, shopper(admissible_parser, bad_at_step=2))
    assert len(episodes) == 4 and not any(ep.failed for ep in episodes)
    for ep in episodes:
        actions = [s.action for s in ep.steps]
        assert actions[0].startswith("search[") and ep.steps[0].anchor_obs == "Search"
        assert ep.steps[1].format_invalid and ep.steps[1].reward == pytest.approx(-0.1)
        assert ep.steps[1].action == "<think>hmm</think> buy it"  # sent raw; the env rejects it
        assert ep.steps[1].env_invalid
        assert ASIN.match(actions[2]) and actions[3] == "click[buy now]"
        last = ep.steps[-1]
        assert len(ep.steps) == 4 and last.terminated and not last.truncated
        score = ep.info["score"]
        assert 0.0 < score <= 1.0 and last.env_reward == pytest.approx(10.0 * score)
        assert ep.won == (score == 1.0)
        assert ep.episode_return == pytest.approx(10.0 * score - 0.1)
        assert all(s.state_extra == "Selected options: none." for s in ep.steps)  # no option clicked
        # the prompt shows the page without the instruction (anchor), the task once
        first = qwen3_tokenizer.decode(ep.steps[0].prompt_ids)
        assert first.count("Instruction:") == 0 and "Your task is to:" in first
    for a, b in ((episodes[0], episodes[1]), (episodes[2], episodes[3])):
        assert a.uid == b.uid and [s.prefix_key for s in a.steps] == [s.prefix_key for s in b.steps]
        assert a.info["score"] == b.info["score"]
    batch = episodes_to_step_batch(episodes)
    assert batch.num_steps == 16 and batch.state_extra is not None
    assert set(batch.state_extra.tolist()) == {"Selected options: none."}
    assert batch.invalid.sum() == 4


def test_context_guard_on_real_result_pages(qwen3_tokenizer, webshop_url, admissible_parser) -> None:
    limit = 400  # a results page with history does not fit: turns dropped, then the page cut
    episodes = _play(qwen3_tokenizer, webshop_url, shopper(admissible_parser), n=1, max_steps=3,
                     max_prompt_tokens=limit)
    steps = [s for ep in episodes for s in ep.steps]
    assert all(len(s.prompt_ids) <= limit for s in steps)
    assert any(s.prompt_truncated_turns > 0 for s in steps)
    assert any(s.prompt_obs_truncated_tokens > 0 for s in steps)
    for s in steps:
        text = qwen3_tokenizer.decode(s.prompt_ids)
        assert qwen3_tokenizer(text, add_special_tokens=False)["input_ids"] == s.prompt_ids
    for ep in episodes:  # turns shown = min(t, K = 2) less those the guard dropped
        assert [s.history_turns for s in ep.steps] == [min(t, 2) - s.prompt_truncated_turns
                                                        for t, s in enumerate(ep.steps)]
    m = rollout_metrics(episodes)
    assert m["rollout/guard_truncated_frac"] > 0 and m["rollout/prompt_len_max"] <= limit


TURN = re.compile(r"\[Observation (\d+): ")


@pytest.mark.parametrize("k", [0, 1, 2, 3, 5, 50])
def test_history_window_shows_min_t_k_most_recent_turns(qwen3_tokenizer, webshop_url, admissible_parser, k) -> None:
    """Issue 12, case 4: step t shows min(t, K) turns, the most recent ones.

    The old slice ``history[len(history) - K:]`` wrapped for t < K: K = 3 showed [0, 1, 1, 3, 3, ...]
    turns and K = 50 showed 50 - t turns once t > 25 (one at t = 49). Episodes run to ``K + 2`` steps.
    """
    max_steps = max(12, k + 2)
    pool = LocalEnvPool(functools.partial(webshop.WebShopEnv, webshop_url, max_steps=max_steps + 1), max_envs=1)
    gen = ScriptedGenerate(qwen3_tokenizer, shopper(admissible_parser, buy=False))

    async def go():
        try:
            cfg = EpisodeConfig(env=EnvSettings(name="webshop", max_steps=max_steps, history_length=k),
                                rollout=RolloutSettings(), sampling=SamplingParams(max_new_tokens=96))
            return await run_episodes([("train", 3)], cfg, env_pool=pool, generate=gen, tokenizer=qwen3_tokenizer)
        finally:
            await pool.close()

    (ep,) = asyncio.run(go())
    assert len(ep.steps) == max_steps and ep.steps[-1].truncated
    shown = []
    for t, s in enumerate(ep.steps):
        numbers = [int(j) for j in TURN.findall(qwen3_tokenizer.decode(s.prompt_ids))]
        want = min(t, k)
        assert numbers == list(range(t - want + 1, t + 1)), (t, numbers)  # 1-based steps t-want+1 .. t
        assert s.history_turns == want
        if want:  # the shown turns are the episode's own most recent (observation, action) pairs
            text = qwen3_tokenizer.decode(s.prompt_ids)
            assert f"Action {t}: '{ep.steps[t - 1].action}'" in text
        shown.append(len(numbers))
    expected_mean = sum(min(t, k) for t in range(max_steps)) / max_steps
    assert rollout_metrics([ep])["rollout/history_turns_mean"] == pytest.approx(expected_mean)
    assert sum(shown) / max_steps == pytest.approx(expected_mean)
def test_chosen_options_reach_the_step_batch_the_page_text_does_not_show_them(qwen3_tokenizer, webshop_url,
                                                                                admissible_parser) -> None:
    """WebShop's analogue of ALFWorld's inventory: after a click on an option the item page reads the
    same (text mode), but ``info["state_extra"]`` and the StepBatch's state_extra say what was chosen."""
    env = webshop.WebShopEnv(webshop_url)
    try:
        _, info = env.reset(split="train", index=0)
        assert info["state_extra"] == "Selected options: none."
        res = env.step(f"search[{info['task']}]")
        items = [a for a in res.info["admissible_actions"] if ASIN.match(a)]
        found = None
        for item in items:  # the first result whose page offers an option
            page = env.step(item)
            fixed = {"click[< prev]", "click[back to search]", "click[description]", "click[features]",
                     "click[reviews]", "click[buy now]", "click[attributes]"}
            options = [a for a in page.info["admissible_actions"] if a not in fixed]
            if options:
                found = (page, options[0])
                break
            env.step("click[< prev]")
        assert found, "no product with options among the first results"
        page, option = found
        after = env.step(option)
        assert not after.info["invalid_action"]
        assert after.info["anchor_observation"] == page.info["anchor_observation"]  # aliased page text
        assert page.info["state_extra"] == "Selected options: none."
        label = option[len("click["):-1]
        assert after.info["state_extra"].startswith("Selected options: ") and label in after.info["state_extra"]
        again = env.step(option)  # the same option again: the same state
        assert again.info["state_extra"] == after.info["state_extra"]
    finally:
        env.close()

    def policy(prompt: str) -> str:  # search, open the product, choose the option, buy
        actions = admissible_parser(prompt)
        m = re.search(r"You are now at step (\d+)", prompt)
        step = int(m.group(1)) if m else 1
        if "search[<your query>]" in actions:
            task = re.search(r"Your task is to: (.*?)\.?\n", prompt).group(1)
            action = f"search[{task}]"
        elif item in actions:
            action = item
        elif step == 3:
            action = option
        else:
            action = "click[buy now]"
        return f"<think>step {step}</think><action>{action}</action>"

    episodes = _play(qwen3_tokenizer, webshop_url, policy, n=1)
    batch = episodes_to_step_batch([ep for ep in episodes if ep.task_id == episodes[0].task_id])
    extra = batch.state_extra.tolist()
    assert extra[:3] == ["Selected options: none."] * 3 and label in extra[3]
    assert batch.anchor_obs[2] == batch.anchor_obs[3]  # the state key needs state_extra to tell them apart
