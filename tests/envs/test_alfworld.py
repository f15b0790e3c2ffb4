"""ALFWorld env on the real json_2.1.1 games (CPU): expert replays, random play, determinism,
the shared conformance checker, inventory, data resolution and success accounting."""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from progpo.agents.parsing import syntax_check
from progpo.envs import make_env
from progpo.envs.base import normalize_action
from progpo.envs.alfworld import AlfWorldEnv, alfworld_state_extra, success_by_task_type, wilson_interval
from progpo.envs.alfworld_data import (
    TASK_TYPE_NAMES,
    resolve_data_dir,
    task_type_of,
    unpack_archive,
)
from progpo.envs.conformance import check_env_conformance

EVAL_SPLITS = ("train", "valid_seen", "valid_unseen")


@pytest.fixture(scope="module")
def env(shared_data: Path) -> AlfWorldEnv:
    e = AlfWorldEnv()
    yield e
    e.close()


def _first_index_per_type(env: AlfWorldEnv, split: str, per_type: int) -> list[int]:
    """The first ``per_type`` game indices of each task type in the sorted game list."""
    picked: dict[str, list[int]] = {t: [] for t in TASK_TYPE_NAMES}
    for i, game in enumerate(env.games(split)):
        bucket = picked[task_type_of(game)]
        if len(bucket) < per_type:
            bucket.append(i)
    return [i for t in TASK_TYPE_NAMES for i in picked[t]]


def _expert_cases(env: AlfWorldEnv) -> list[tuple[str, int]]:
    # 6 task types x 3 splits, plus the second train game of two types: 20 games.
    cases = [(s, i) for s in EVAL_SPLITS for i in _first_index_per_type(env, s, 1)]
    cases += [("train", i) for i in _first_index_per_type(env, "train", 2)[1:4:2]]
    return cases


def _walkthrough(info: dict) -> list[str]:
    with open(info["game_file"]) as f:
        return list(json.load(f)["walkthrough"])


def test_game_counts_match_the_release(env: AlfWorldEnv) -> None:
    counts = {s: env.num_tasks(s) for s in ("train", "valid_seen", "valid_unseen", "valid_train")}
    assert counts == {"train": 3553, "valid_seen": 140, "valid_unseen": 134, "valid_train": 200}
    assert list(env.games("valid_seen")) == sorted(env.games("valid_seen"))


@pytest.mark.slow  # 20 real games, ~40 CPU-s
def test_expert_walkthroughs_win_over_all_task_types_and_splits(env: AlfWorldEnv) -> None:
    cases = _expert_cases(env)
    seen_types: Counter = Counter()
    seen_splits: Counter = Counter()
    for split, index in cases:
        obs, info = env.reset(split=split, index=index)
        assert info["task"] and info["task"] in obs
        assert not info["won"] and "help" not in info["admissible_actions"]
        rewards = []
        for action in _walkthrough(info):
            assert not info["won"]
            assert action in info["admissible_actions"], (info["task_id"], action)
            assert all(syntax_check("alfworld")(a) for a in info["admissible_actions"])  # the format check's grammar
            res = env.step(action)
            info = res.info
            assert not res.info["invalid_action"]
            rewards.append(res.reward)
        assert res.terminated and not res.truncated and info["won"], info["task_id"]
        assert rewards[-1] == 10.0 and sum(rewards) == 10.0
        seen_types[info["task_type"]] += 1
        seen_splits[split] += 1
    assert len(cases) == len(set(cases)) >= 20
    assert set(seen_types) == set(TASK_TYPE_NAMES)
    assert set(seen_splits) == set(EVAL_SPLITS)


def test_random_admissible_agent_is_truncated_at_max_steps(env: AlfWorldEnv) -> None:
    rng = random.Random(0)
    listed: set[str] = set()
    for split in ("train", "valid_unseen"):
        _, info = env.reset(split=split, seed=7)
        for t in range(1, env.max_steps + 1):
            # Avoid the winning-prone final actions by never taking "move"/"put" (a random agent
            # that wins early would end before truncation and test nothing).
            choices = [a for a in info["admissible_actions"] if not a.startswith("move ")]
            listed.update(info["admissible_actions"])
            res = env.step(rng.choice(choices))
            info = res.info
            assert isinstance(res.reward, float) and info["steps"] == t
            if res.done:
                break
        assert res.truncated and not res.terminated and t == env.max_steps == 50
        with pytest.raises(RuntimeError, match="call reset"):
            env.step("look")
    # every command the env listed on the way is one command of the answer-format check's grammar
    assert len(listed) > 50
    assert all(syntax_check("alfworld")(a) and a == normalize_action(a) for a in listed), sorted(
        a for a in listed if not syntax_check("alfworld")(a))


def test_group_resets_give_identical_first_states(env: AlfWorldEnv) -> None:
    firsts = [env.reset(split="valid_unseen", index=11) for _ in range(3)]
    assert all(obs == firsts[0][0] for obs, _ in firsts)
    assert all(info["admissible_actions"] == firsts[0][1]["admissible_actions"] for _, info in firsts)
    assert len({info["task_id"] for _, info in firsts}) == 1
    other, _ = env.reset(split="valid_unseen", index=12)
    assert other != firsts[0][0]
    # a seed picks one game deterministically, across env instances too
    assert env.game_index("train", seed=123) == AlfWorldEnv().game_index("train", seed=123)
    import numpy as np

    assert env.game_index("train", seed=np.int64(123)) == env.game_index("train", seed=123)
    assert env.game_index("train", index=np.int64(5)) == 5
    picks = {env.game_index("train", seed=s) for s in range(50)}
    assert len(picks) > 40


def test_shared_conformance_checker_passes(env: AlfWorldEnv) -> None:
    check_env_conformance(env, split="valid_seen", index=5, n_random_steps=10)
    built = make_env("alfworld", max_steps=3)
    check_env_conformance(built, split="valid_unseen", index=0, n_random_steps=5)
    built.close()


def test_invalid_commands_get_the_games_answer_and_are_flagged(env: AlfWorldEnv) -> None:
    _, info = env.reset(split="valid_seen", index=0)
    for bad in ("fly to the moon", "", "go to desk 99", "help"):
        res = env.step(bad)
        assert res.info["invalid_action"] and res.reward == 0.0 and not res.done, bad
        if bad != "help":
            assert res.observation == "Nothing happens."
    res = env.step("  GO TO   Desk 1 ")  # case and spacing are normalised
    assert not res.info["invalid_action"] and res.observation.startswith("You arrive at desk 1.")


def test_inventory_info_matches_the_games_inventory_answer(env: AlfWorldEnv) -> None:
    _, info = env.reset(split="valid_seen", index=_first_index_per_type(env, "valid_seen", 1)[4])
    assert info["task_type"] == "Cool" and info["inventory"] == "You are not carrying anything."
    held_seen = False
    cooled = False
    for action in _walkthrough(info)[:-1]:
        res = env.step(action)
        asked = env.step("inventory")
        assert res.info["inventory"] == asked.observation == asked.info["inventory"]
        cooled |= action.startswith("cool ")
        # the protocol's key for the state keys: the inventory, then the held object's transition (not shown by
        # the observation or the inventory) once the walkthrough has cooled it
        held = re.fullmatch(r"You are carrying: an? (\w+ \d+)\.", res.info["inventory"])
        want = f"{res.info['inventory']} The {held.group(1)} is cool." if cooled and held else res.info["inventory"]
        assert res.info["state_extra"] == want
        held_seen |= asked.observation.startswith("You are carrying: ")
    assert held_seen and cooled


@pytest.mark.parametrize("kind, word", [("Clean", "clean"), ("Heat", "hot")])
def test_state_extra_names_the_held_objects_transition(env: AlfWorldEnv, kind: str, word: str) -> None:
    _, info = env.reset(split="valid_seen", index=_first_index_per_type(env, "valid_seen", 1)[TASK_TYPE_NAMES.index(kind)])
    assert info["task_type"] == kind
    actions = _walkthrough(info)[:-1]
    infos = [env.step(action).info for action in actions]
    extras = [i["state_extra"] for i in infos]
    done = next(i for i, a in enumerate(actions) if a.startswith(kind.lower() + " "))
    assert [i["state_extra"] for i in infos[:done]] == [i["inventory"] for i in infos[:done]]
    for e in extras[done:]:
        assert re.fullmatch(rf"You are carrying: an? (\w+ \d+)\. The \1 is {word}\.", e), e


def test_alfworld_state_extra_sentence() -> None:
    inv = "You are carrying: a mug 1, a pen 2."
    assert alfworld_state_extra(inv, []) == inv and alfworld_state_extra(inv, [("mug 1", [])]) == inv
    assert alfworld_state_extra(inv, [("mug 1", ["clean", "hot"]), ("pen 2", ["cool"])]) == (
        inv + " The mug 1 is clean and hot. The pen 2 is cool.")


def test_bad_arguments_raise_clear_errors(env: AlfWorldEnv, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown ALFWorld split 'test'"):
        env.reset(split="test", index=0)
    with pytest.raises(ValueError, match=r"index must be an int in \[0, 140\)"):
        env.reset(split="valid_seen", index=140)
    with pytest.raises(ValueError, match="index= or seed="):
        env.reset(split="valid_seen")
    with pytest.raises(ValueError, match="max_steps"):
        AlfWorldEnv(max_steps=0)
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        AlfWorldEnv(data_dir=missing)


def test_data_dir_resolution(env: AlfWorldEnv, tmp_path: Path, monkeypatch) -> None:
    dataset = env.data_dir
    assert resolve_data_dir(dataset) == dataset  # a json_2.1.1 folder
    assert resolve_data_dir(dataset.parent) == dataset  # a folder holding one
    monkeypatch.setenv("ALFWORLD_DATA", str(dataset.parent))
    assert resolve_data_dir() == dataset
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA="):
        resolve_data_dir()
    monkeypatch.delenv("ALFWORLD_DATA")
    monkeypatch.setenv("PROGPO_ALFWORLD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PROGPO_DATA", str(tmp_path / "no_data"))
    with pytest.raises(FileNotFoundError, match="json_2.1.1.tar.xz"):
        resolve_data_dir()


def test_unpack_archive_once(shared_data: Path, tmp_path: Path) -> None:
    archive = shared_data / "alfworld" / "json_2.1.1.tar.xz"
    target = unpack_archive(archive, tmp_path)
    assert len(list((target / "valid_unseen").glob("*/*/game.tw-pddl"))) == 134
    stamp = (target / ".progpo_unpacked").stat().st_mtime_ns
    assert unpack_archive(archive, tmp_path) == target  # second call: no new unpack
    assert (target / ".progpo_unpacked").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".unpack-")] == []
    with pytest.raises(FileNotFoundError, match="missing.tar.xz"):
        unpack_archive(tmp_path / "missing.tar.xz", tmp_path)


def test_success_by_task_type_counts_and_wilson_intervals() -> None:
    types = ["Pick", "Pick", "Look", "Heat", "Heat", "Heat", "Pick2"]
    won = [True, False, True, True, True, False, False]
    table = success_by_task_type(types, won)
    assert list(table) == [*TASK_TYPE_NAMES, "overall"]
    assert (table["Pick"].n, table["Pick"].wins, table["Pick"].rate) == (2, 1, 0.5)
    assert (table["overall"].n, table["overall"].wins) == (7, 4)
    assert table["Clean"].n == 0 and math.isnan(table["Clean"].rate)
    # Wilson 95% interval for 4/7, checked against scipy's independent implementation.
    from scipy.stats import binomtest

    ci = binomtest(4, 7).proportion_ci(confidence_level=0.95, method="wilson")
    assert table["overall"].low == pytest.approx(ci.low) and table["overall"].high == pytest.approx(ci.high)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-4)
    with pytest.raises(ValueError, match="unknown task type 'Slice'"):
        success_by_task_type(["Slice"], [True])
    with pytest.raises(ValueError, match="differ in length"):
        success_by_task_type(["Pick"], [True, False])


def test_envs_in_threads_of_one_process_local_pool(env: AlfWorldEnv) -> None:
    """TextWorld's parser is not thread-safe; the env's process-wide lock makes LocalEnvPool work
    (without it, concurrent resets fail with IndexError/TypeError inside tatsu)."""
    import asyncio
    import functools

    from progpo.envs.local_pool import LocalEnvPool

    pool = LocalEnvPool(functools.partial(make_env, "alfworld"), max_envs=4)

    async def episode(i: int) -> bool:
        _, info = await pool.reset(i, split="valid_unseen", index=3 * i)
        for action in _walkthrough(info):
            res = await pool.step(i, action)
        await pool.release(i)
        return res.info["won"]

    async def run() -> list[bool]:
        try:
            return await asyncio.gather(*[episode(i) for i in range(4)])
        finally:
            await pool.close()

    assert asyncio.run(run()) == [True] * 4


def _play(env: AlfWorldEnv, split: str, index: int, seed: int, steps: int = 8) -> list:
    """Everything an agent sees on a seeded random walk of admissible actions (and one invalid command)."""
    rng = random.Random(seed)
    obs, info = env.reset(split=split, index=index)
    seen = [obs, info["admissible_actions"], info["inventory"], info["state_extra"], info["task"]]
    for k in range(steps):
        action = "fly to the moon" if k == 3 else rng.choice(info["admissible_actions"])
        res = env.step(action)
        info = res.info
        seen.append((res.observation, res.reward, res.terminated, res.truncated, info["admissible_actions"],
                     info["inventory"], info["state_extra"], info["won"], info["invalid_action"]))
        if res.terminated or res.truncated:
            break
    return seen


def test_cached_translations_play_the_same_games_as_the_translator(env: AlfWorldEnv, monkeypatch) -> None:
    """The PDDL -> SAS memo changes no observation, admissible list, inventory, reward or end of any walk: the
    same seeded walks, the first valid_seen game of each task type and a train game, with fast-downward's own translator and
    with the memo (first misses, then hits), give the same trace; and a group's resets hit."""
    import fast_downward

    from progpo.envs import alfworld as alf

    env.reset(split="train", index=0)  # installs the memo
    memo = fast_downward.pddl2sas
    assert isinstance(memo, alf._TranslationCache)
    games = [("valid_seen", i) for i in _first_index_per_type(env, "valid_seen", 1)] + [("train", 7)]
    monkeypatch.setattr(fast_downward, "pddl2sas", memo.translate)
    truth = [_play(env, split, i, seed) for seed, (split, i) in enumerate(games)]
    monkeypatch.setattr(fast_downward, "pddl2sas", memo)
    memo.entries.clear()
    for _ in range(2):  # misses, then hits
        assert [_play(env, split, i, seed) for seed, (split, i) in enumerate(games)] == truth
    hits = memo.hits
    for _ in range(4):  # a group of 4 on one game: 4 translations per reset, every one a hit now
        env.reset(split="train", index=7)
    assert memo.hits - hits == 16


def test_translation_cache_is_bounded_and_hands_out_copies() -> None:
    from progpo.envs.alfworld import _TranslationCache

    calls = []

    def translate(domain, problem, verbose=False, optimize=False):
        calls.append((domain, problem, optimize))
        return {"task": [domain, problem]}, f"sas {problem} {optimize}"

    memo = _TranslationCache(translate, max_entries=2)
    a, sas_a = memo("d", "p1")
    b, sas_b = memo("d", "p1")
    assert a == b and a is not b and sas_a == sas_b and len(calls) == 1  # a hit is a copy, not the cached object
    a["task"].append("mutated")
    assert memo("d", "p1")[0] == {"task": ["d", "p1"]}
    assert memo("d", "p1", optimize=True)[1] == "sas p1 True" and len(calls) == 2  # optimize is part of the key
    memo("d", "p2")  # evicts the least recently used entry, (p1, plain)
    assert len(memo.entries) == 2 and len(calls) == 3
    memo("d", "p1", optimize=True)
    assert len(calls) == 3  # (p1, optimised) is still held
    memo("d", "p1")
    assert len(calls) == 4  # (p1, plain) had been evicted
    memo("d", "p1", verbose=True)
    assert len(calls) == 5 and len(memo.entries) == 2  # verbose calls pass through, uncached
