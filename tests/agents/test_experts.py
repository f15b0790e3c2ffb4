"""Experts for behaviour cloning: the WebShop script's decisions, ALFWorld walkthroughs, and that
expert steps come out of the RL episode loop (real ALFWorld games from the shared data)."""

from __future__ import annotations

import asyncio
import functools
import json

import pytest

from progpo.agents.experts import (AlfWorldExpert, WebShopExpert, alfworld_walkthrough, expert_episodes, goal_query,
                                   render_answer)
from progpo.agents.parsing import parse_action
from progpo.run.settings import EnvSettings, RolloutSettings

GOAL = {
    "asin": "B07MGB73NJ",
    "instruction_text": "Find me machine wash women's tops with short sleeve with color: sunflowers, and size: large, "
                        "and price lower than 50.00 dollars",
    "goal_options": {"color": "sunflowers", "size": "large"},
}


def _info(actions, task=GOAL["instruction_text"]):
    return {"task": task, "task_id": "0", "admissible_actions": actions}


def test_goal_query_drops_the_option_and_price_clauses():
    assert goal_query(GOAL) == "find me machine wash women's tops with short sleeve"
    human = {"instruction_text": "i need a red tea kettle, and price lower than 40.00 dollars", "goal_options": ["red"]}
    assert goal_query(human) == "i need a red tea kettle"


def test_webshop_expert_searches_opens_picks_options_and_buys():
    ex = WebShopExpert([GOAL])
    think, action = ex.act(_info(["search[<your query>]"]))
    assert action == f"search[{goal_query(GOAL)}]" and think
    others = ["click[back to search]", "click[next >]", "click[b000000001]"]
    assert ex.act(_info(others))[1] == "click[next >]"  # goal product not on page 1
    assert ex.act(_info(others[:2] + ["click[b07mgb73nj]"]))[1] == "click[b07mgb73nj]"
    item = ["click[back to search]", "click[< prev]", "click[sunflowers]", "click[green2]", "click[large]",
            "click[x-large]", "click[buy now]"]
    assert [ex.act(_info(item))[1] for _ in range(3)] == ["click[sunflowers]", "click[large]", "click[buy now]"]
    for think, action in ((t, a) for t, a in [ex.act(_info(item))]):
        parsed, valid = parse_action(render_answer(think, action), "webshop")
        assert valid and parsed == action


def test_webshop_expert_gives_up_after_max_pages_and_checks_the_goal():
    ex = WebShopExpert([GOAL], max_pages=1)
    ex.act(_info(["search[<your query>]"]))
    assert ex.act(_info(["click[back to search]", "click[next >]", "click[b000000001]"]))[1] == "click[b000000001]"
    with pytest.raises(ValueError, match="different data"):
        WebShopExpert([GOAL]).act(_info(["search[<your query>]"], task="another instruction"))


def test_alfworld_expert_replays_the_walkthrough(tmp_path):
    game = tmp_path / "game.tw-pddl"
    game.write_text(json.dumps({"walkthrough": ["go to dresser 1", "Take  alarmclock 2 from dresser 1"]}))
    assert alfworld_walkthrough(game) == ["go to dresser 1", "take alarmclock 2 from dresser 1"]
    ex = AlfWorldExpert()
    acts = [ex.act({"game_file": str(game), "steps": t}) for t in range(3)]
    assert [a for _, a in acts] == ["go to dresser 1", "take alarmclock 2 from dresser 1", "look"]
    assert all(parse_action(render_answer(t, a), "alfworld")[1] for t, a in acts)
    game.write_text(json.dumps({"walkthrough": []}))
    with pytest.raises(ValueError, match="no walkthrough"):
        alfworld_walkthrough(game)


def test_alfworld_walkthroughs_win_through_the_episode_loop(shared_data, qwen3_tokenizer):
    alfworld = pytest.importorskip("progpo.envs.alfworld")
    from progpo.agents.episode import TaskSpec
    from progpo.envs.local_pool import LocalEnvPool

    pool = LocalEnvPool(functools.partial(alfworld.AlfWorldEnv, max_steps=30), max_envs=2)

    async def go():
        try:
            return await expert_episodes([TaskSpec("valid_seen", 0), TaskSpec("valid_seen", 1)], env_pool=pool,
                                         tokenizer=qwen3_tokenizer, env=EnvSettings(name="alfworld", max_steps=30),
                                         rollout=RolloutSettings(max_prompt_tokens=2048), make_expert=AlfWorldExpert)
        finally:
            await pool.close()

    episodes = asyncio.run(go())
    assert all(ep.won and not ep.failed for ep in episodes)
    for ep in episodes:
        assert all(not s.format_invalid and not s.env_invalid for s in ep.steps)
        walk = alfworld_walkthrough(ep.info["game_file"])
        assert [s.action for s in ep.steps] == walk[: len(ep.steps)]
        # the RL prompt protocol: step 3 shows the last two (observation, action) pairs
        prompt = qwen3_tokenizer.decode(ep.steps[2].prompt_ids)
        assert f"Action 1: '{walk[0]}'" in prompt and f"Action 2: '{walk[1]}'" in prompt
        assert ep.steps[2].response_text.startswith("<think>") and ep.steps[2].response_text.endswith("</action>")


def test_alfworld_think_text_is_short_and_reads_right():
    from progpo.agents.experts import _alfworld_think

    assert _alfworld_think("go to dresser 1") == "Next I go to dresser 1."
    assert _alfworld_think("heat mug 1 with microwave 1") == "The task needs it hot, so I heat mug 1 with microwave 1."
    assert _alfworld_think("inventory") == "Next I inventory."
