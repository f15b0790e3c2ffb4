"""Agent API and client env against a real server process: protocol, agents, bad input, concurrency."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from envs.webshop_server.reward import get_reward
from progpo.envs.conformance import check_env_conformance
from progpo.envs.webshop import SEARCH_MARKER, WebShopEnv
from progpo_tests.patience import PATIENCE_S


def test_conformance(server):
    env = WebShopEnv(server.url, timeout_s=PATIENCE_S)
    check_env_conformance(env, split="test", index=3, n_random_steps=20)
    check_env_conformance(env, split="train", index=0, n_random_steps=20, seed=1)
    env.close()


def test_reset_info_and_anchor(server):
    env = WebShopEnv(server.url, max_steps=15, timeout_s=PATIENCE_S)
    obs, info = env.reset(split="eval", index=2)
    assert obs == f"WebShop [SEP] Instruction: [SEP] {info['task']} [SEP] Search"
    assert info["anchor_observation"] == "Search"
    assert info["admissible_actions"] == [SEARCH_MARKER]
    res = env.step("search[shirt]")
    assert res.info["anchor_observation"].startswith("Back to Search [SEP] Page 1 (Total results: ")
    assert res.info["admissible_actions"][0] == "click[back to search]"
    assert not res.info["invalid_action"] and res.reward == 0.0
    with pytest.raises(ValueError, match="split"):
        env.reset(split="valid", index=0)
    with pytest.raises(ValueError, match="out of range"):
        env.reset(split="test", index=10_000)
    env.close()


def _scripted_episode(env, split, index, goal):
    env.reset(split=split, index=index)
    res = env.step(f"search[{goal['name'].lower()}]")
    target = f"click[{goal['asin'].lower()}]"
    for _ in range(5):
        if target in res.info["admissible_actions"]:
            break
        res = env.step("click[next >]")
    assert target in res.info["admissible_actions"], goal["asin"]
    res = env.step(target)
    for value in goal["goal_options"].values():
        res = env.step(f"click[{value}]")
        assert not res.info["invalid_action"], value
    return env.step("click[buy now]")


def test_scripted_agent_buys_goal_product(server, shop):
    """20 train goals whose goal product with goal options scores 1.0 (oracle); the agent must get it."""
    env = WebShopEnv(server.url, success_reward=10.0, timeout_s=PATIENCE_S)
    lo, hi = shop.splits.range("train")
    played = 0
    for gi in range(lo, hi):
        goal = shop.goals[gi]
        product = shop.catalog.by_asin[goal["asin"]]
        oracle, _ = get_reward(product, goal, shop.catalog.prices[goal["asin"]], goal["goal_options"])
        if oracle != 1.0:
            continue
        res = _scripted_episode(env, "train", gi - lo, goal)
        assert res.terminated and not res.truncated
        assert res.info["score"] == 1.0 and res.reward == 10.0 and res.info["won"]
        assert res.info["reward_breakdown"]["r_type"] == 1.0
        played += 1
        if played == 20:
            break
    assert played == 20
    env.close()


def test_random_agent_never_crashes(server):
    env = WebShopEnv(server.url, max_steps=30, timeout_s=PATIENCE_S)
    rng = random.Random(0)
    words = ["shoes", "red", "shirt", "table", "x", "pack of 10", "ñandú", "", "[", "]"]
    for episode in range(15):
        res = None
        obs, info = env.reset(split="train", seed=episode)
        done = False
        while not done:
            actions = info["admissible_actions"]
            r = rng.random()
            if r < 0.15:
                action = f"search[{' '.join(rng.choices(words, k=rng.randint(1, 4)))}]"
            elif r < 0.25:
                action = rng.choice(["click[nothing]", "buy", "click[]", "search[]", "click[search]", "\x00", "a" * 700])
            else:
                action = rng.choice(actions) if actions else "click[back to search]"
                if action == SEARCH_MARKER:
                    action = "search[" + rng.choice(words) + "]"
            res = env.step(action)
            info = res.info
            done = res.done
            assert isinstance(res.reward, float) and 0.0 <= res.reward <= 10.0
        assert res is not None and (res.terminated or res.truncated)
    env.close()


def test_bad_input_gets_4xx_json_and_server_keeps_serving(server):
    base = server.url
    sid = requests.post(f"{base}/api/sessions", json={"split": "test", "index": 0},
                        timeout=PATIENCE_S).json()["session_id"]
    cases = [
        ("post", f"{base}/api/sessions/unknownsession/step", {"json": {"action": "search[x]"}}, 404),
        ("post", f"{base}/api/sessions/{sid}/step", {"json": {"action": 5}}, 400),
        ("post", f"{base}/api/sessions/{sid}/step", {"data": b"\xff\xfe{"}, 400),
        ("post", f"{base}/api/sessions/{sid}/step", {"data": b"{not json"}, 400),
        ("post", f"{base}/api/sessions/{sid}/step", {"json": {"action": "search[" + "a" * 5000 + "]"}}, 413),
        ("post", f"{base}/api/sessions/{sid}/step", {"data": b"x" * 100_000}, 413),
        ("post", f"{base}/api/sessions", {"json": {"split": "nope", "index": 0}}, 400),
        ("post", f"{base}/api/sessions", {"json": {"split": "test", "index": "0"}}, 400),
        ("post", f"{base}/api/sessions", {"json": {"goal_index": 10**9}}, 400),
        ("post", f"{base}/api/sessions", {"json": {"split": "test", "index": 0, "observation_mode": "pdf"}}, 400),
        ("get", f"{base}/item_page/{sid}/B000000000/%5B%27x%27%5D/1/%7B%7D", {}, 404),
        ("get", f"{base}/item_page/{sid}/..%2F..%2Fetc%2Fpasswd/x/1/%7B%7D", {}, 404),
        ("get", f"{base}/item_page/{sid}/B06Y3VLDFB/x/1/%7B%27color%27%3A%20%27nope%27%7D", {}, 400),
        ("get", f"{base}/item_page/{sid}/B06Y3VLDFB/x/1/__import__('os')", {}, 400),
        ("get", f"{base}/search_results/{sid}/%FF%FE/1", {}, 400),
        ("get", f"{base}/search_results/{sid}/x/-1", {}, 400),
        ("get", f"{base}/search_results/{sid}/" + "%5B" * 3000 + "/1", {}, 414),
        ("get", f"{base}/static/..%2F..%2Fapp.py", {}, 404),
        ("get", f"{base}/item_sub_page/{sid}/B06Y3VLDFB/x/1/Secrets/%7B%7D", {}, 404),
    ]
    for method, url, kwargs, status in cases:
        r = getattr(requests, method)(url, timeout=PATIENCE_S, **kwargs)
        assert r.status_code == status, (url[:120], r.status_code, r.text[:200])
        assert "error" in r.json(), url[:120]
    # a malformed action is a no-op with a message, not an error
    r = requests.post(f"{base}/api/sessions/{sid}/step", json={"action": "jump[around]"}, timeout=PATIENCE_S).json()
    assert r["valid"] is False and "search[query] or click[label]" in r["message"]
    assert requests.get(f"{base}/health", timeout=PATIENCE_S).json()["status"] == "ok"
    assert requests.delete(f"{base}/api/sessions/{sid}", timeout=PATIENCE_S).status_code == 200
    assert requests.get(f"{base}/api/sessions/{sid}", timeout=PATIENCE_S).status_code == 404


def test_session_ids_unguessable(server):
    ids = {requests.post(f"{server.url}/api/sessions", json={"split": "test", "index": 1},
                         timeout=PATIENCE_S).json()["session_id"]
           for _ in range(5)}
    assert len(ids) == 5 and all(len(s) >= 24 for s in ids)
    for sid in ids:
        requests.delete(f"{server.url}/api/sessions/{sid}", timeout=PATIENCE_S)


def test_concurrent_sessions_no_error_no_leak(server, shop):
    """32 clients x 50 steps in parallel; each sees only its own goal and its own page."""
    n_train = shop.splits.size("train")

    def client(k: int) -> int:
        env = WebShopEnv(server.url, max_steps=1000, timeout_s=PATIENCE_S)
        rng = random.Random(k)
        index = (k * 7) % n_train
        obs, info = env.reset(split="train", index=index)
        task = info["task"]
        assert task == shop.goals[shop.splits.goal_index("train", index)]["instruction_text"]
        query = f"search[{['shirt', 'shoes', 'table', 'tea', 'wig'][k % 5]}]"
        steps = 0
        while steps < 50:
            actions = [a for a in info["admissible_actions"] if a != "click[buy now]"]
            action = query if (SEARCH_MARKER in actions or not actions or rng.random() < 0.1) else rng.choice(actions)
            res = env.step(action)
            steps += 1
            info = res.info
            assert info["task"] == task
            if "Instruction:" in res.observation:
                assert task in res.observation  # never another session's instruction
            assert not res.done
        env.close()
        return steps

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(client, range(32)))
    assert results == [50] * 32


def test_truncation_and_steps_after_end(server):
    env = WebShopEnv(server.url, max_steps=3, timeout_s=PATIENCE_S)
    env.reset(split="test", index=5)
    results = [env.step("search[shirt]"), env.step("click[back to search]"), env.step("search[tea]")]
    assert [r.truncated for r in results] == [False, False, True]
    assert not any(r.terminated for r in results)
    after = env.step("search[wig]")
    assert after.truncated and not after.terminated and after.reward == 0.0 and after.info["invalid_action"]
    env.close()
