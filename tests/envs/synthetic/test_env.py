"""The synthetic families as product envs: protocol, outcome draws, rewards, expert, the real envs' templates and
parser, and the exact oracle on the env's own task."""

from __future__ import annotations

import math

import numpy as np
import pytest

from progpo.agents.experts import render_answer
from progpo.agents.parsing import parse_action
from progpo.agents.templates import get_template
from progpo.envs import env_class, env_ids, make_env, spec
from progpo.envs.conformance import check_env_conformance
from progpo.envs.synthetic.env import SyntheticEnv, SyntheticExpert
from research.oracle import ExactOracle
NAMES = [name for name in env_ids() if env_class(name) is SyntheticEnv]


def test_both_families_are_registered_through_the_spec():
    assert len(NAMES) == 2
    assert {make_env(n).family.name for n in NAMES} == {"alfworld", "webshop"}
    for name in NAMES:
        s = spec(name)
        assert env_class(name) is SyntheticEnv and s.expert and s.service is None
        real = {"alfworld": "alfworld", "webshop": "webshop"}[make_env(name).family.name]
        assert get_template(name) is get_template(real)  # the real env's template object itself
        real_ok, own_ok = spec(real).load("syntax"), s.load("syntax")
        for action in ("go to shelf 2", "take mug 1 from desk 1", "search[red mug]", "click[buy now]", "fly"):
            assert own_ok(action) == real_ok(action), action  # the real grammar, ...
    # ... plus the family's placing command, the one command the real ALFWorld games spell "move .. to .."
    assert spec("alfworld_like").load("syntax")("put mug 1 in/on shelf 2")
    assert not spec("alfworld").load("syntax")("put mug 1 in/on shelf 2")


@pytest.mark.parametrize("name", NAMES)
def test_conformance(name):
    for index in (0, 7):
        check_env_conformance(make_env(name), split="train", index=index, n_random_steps=40, seed=index)
    check_env_conformance(make_env(name), split="test", index=3)


@pytest.mark.parametrize("name", NAMES)
def test_expert_wins_every_task_and_its_answers_parse(name):
    env, expert = make_env(name), SyntheticExpert()
    wins = 0
    for index in range(40):
        _, info = env.reset(split="train", index=index)
        while True:
            think, action = expert.act(info)
            parsed, valid = parse_action(render_answer(think, action), name)
            assert valid and parsed in [a.lower() for a in info["admissible_actions"]], (action, parsed)
            res = env.step(parsed)
            assert not res.info["invalid_action"]
            info = res.info
            if res.done:
                break
        wins += info["won"]
    assert wins == 40


def test_outcome_draws_follow_the_family_probabilities():
    """A first "go to" slips with the family's probability over independent histories (reset seeds)."""
    env = make_env("alfworld_like")
    slips, n = 0, 3000
    slip = env.cfg.slip
    for seed in range(n):
        _, info = env.reset(split="train", index=5, seed=seed)
        target = info["admissible_actions"][0]
        res = env.step(target)
        slips += res.info["latent_state"][0] != env.task("train", 5).locations.index(target[6:])
    sd = math.sqrt(slip * (1 - slip) / n)
    assert abs(slips / n - slip) < 4 * sd, (slips / n, slip)


def test_equal_histories_get_equal_outcomes_and_reset_is_deterministic():
    a, b = make_env("alfworld_like"), make_env("alfworld_like")
    oa, ia = a.reset(split="train", index=11)
    ob, ib = b.reset(split="train", index=11)
    assert (oa, ia["latent_state"]) == (ob, ib["latent_state"])
    rng = np.random.default_rng(0)
    for _ in range(12):
        action = ia["admissible_actions"][int(rng.integers(len(ia["admissible_actions"])))]
        ra, rb = a.step(action), b.step(action)
        assert (ra.observation, ra.reward, ra.terminated, ra.truncated) == (rb.observation, rb.reward, rb.terminated,
                                                                           rb.truncated)
        ia = ra.info
        if ra.done:
            break


def test_invalid_action_costs_a_step_gives_reward_0_and_keeps_the_state():
    env = make_env("alfworld_like", max_steps=3)
    _, info = env.reset(split="train", index=2)
    res = env.step("take the moon from the sky")
    assert res.info["invalid_action"] and res.reward == 0.0 and res.observation == "Nothing happens."
    assert res.info["latent_state"] == info["latent_state"] and res.info["steps"] == 1
    res = env.step(" " + info["admissible_actions"][0].upper().replace(" ", "  \t"))  # normalised, as every env's labels
    assert not res.info["invalid_action"]
    res = env.step("look")
    assert res.truncated and not res.terminated and env.max_steps == 3


def test_webshop_like_reward_score_and_won():
    env = make_env("webshop_like")
    _, info = env.reset(split="train", index=4)
    task = env.task("train", 4)
    while True:  # follow the expert but buy a wrong size: partial reward, not won
        action = info["expert_action"]
        if action == "click[buy now]" or (action.startswith("click[") and action[6:-1] == task.size):
            break
        info = env.step(action).info
    res = env.step("click[buy now]")
    assert res.terminated and not res.info["won"]
    assert res.info["score"] == pytest.approx(0.75) and res.reward == pytest.approx(7.5)
    assert spec("webshop_like").reports_score


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="n_locatons"):
        SyntheticEnv("alfworld", config={"n_locatons": 3})
    with pytest.raises(ValueError, match="unknown task family"):
        SyntheticEnv("sokoban")
    with pytest.raises(ValueError, match="split"):
        make_env("webshop_like").reset(split="valid", index=0)
    with pytest.raises(ValueError, match="index"):
        make_env("webshop_like").reset(split="test", index=10_000)


def test_train_and_test_tasks_are_disjoint_and_seeded():
    env = make_env("alfworld_like")
    assert env.task_seed("train", 3) == 3 and env.task_seed("test", 3) == 1_000_000_003
    assert env.split_sizes() == {"train": 1_000_000, "test": 10_000}


def test_exact_oracle_solves_the_env_task_and_agrees_with_the_env():
    """The oracle's value of the expert (as a deterministic policy) equals the discounted return the env pays."""
    env = make_env("alfworld_like", config={"slip": 0.0, "fail": 0.0})
    task = env.task("train", 9)

    class ExpertMDP:
        horizon, gamma, history = task.horizon, task.gamma, 0

        def initial(self):
            return task.initial()

        def outcomes(self, state, action):
            return task.outcomes(state, action)

        def policy(self, state, obs, hist):
            return [(task.expert_action(state), 1.0)]

    oracle = ExactOracle(ExpertMDP())
    _, info = env.reset(split="train", index=9)
    ret, t = 0.0, 0
    while True:
        res = env.step(info["expert_action"])
        ret += task.gamma ** t * res.reward
        t, info = t + 1, res.info
        if res.done:
            break
    assert oracle.start_value() == pytest.approx(ret)
