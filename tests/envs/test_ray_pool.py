"""RayEnvPool over real ALFWorld games: 8 actors, concurrent episodes, an actor killed mid-run."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from progpo.envs.base import EnvFailure  # noqa: E402
from progpo.envs.ray_pool import RayEnvPool  # noqa: E402

NUM_ACTORS = 8
pytestmark = pytest.mark.slow  # ~90 CPU-s for the module (8 actor processes, ~30 real games)


@pytest.fixture(scope="module")
def pool(shared_data: Path) -> RayEnvPool:
    was_running = ray.is_initialized()
    p = RayEnvPool("alfworld", {"max_steps": 50}, num_actors=NUM_ACTORS, num_cpus_per_actor=0.25)
    yield p
    asyncio.run(p.close())
    assert ray.is_initialized() == was_running  # a pool shuts down only the Ray it started


async def _expert_episode(
    pool: RayEnvPool, episode_id: Any, split: str, index: int, kill_after: int | None = None
) -> dict[str, Any]:
    """Scripted policy: replay the game's expert walkthrough; report how the episode ended."""
    actor_pid = None
    try:
        obs, info = await pool.reset(episode_id, split=split, index=index)
        actor_pid = await pool.actor_handle(episode_id).pid.remote()
        with open(info["game_file"]) as f:
            walkthrough = json.load(f)["walkthrough"]
        for t, action in enumerate(walkthrough, start=1):
            res = await pool.step(episode_id, action)
            if kill_after == t:
                ray.kill(pool.actor_handle(episode_id), no_restart=True)
        return {"id": episode_id, "won": res.info["won"], "steps": t, "actor": actor_pid,
                "task_type": res.info["task_type"]}
    except EnvFailure as exc:
        return {"id": episode_id, "failed": str(exc), "actor": actor_pid}
    finally:
        await pool.release(episode_id)


def test_sixteen_episodes_on_eight_actors_all_accounted_for(pool: RayEnvPool) -> None:
    async def run() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *[_expert_episode(pool, ("a", i), "valid_seen", i * 7) for i in range(16)]
        )

    results = asyncio.run(run())
    assert sorted(r["id"] for r in results) == [("a", i) for i in range(16)]
    assert all(r.get("won") for r in results), [r for r in results if not r.get("won")]
    # the 16 concurrent episodes were spread over all 8 actors
    per_actor = Counter(r["actor"] for r in results)
    assert len(per_actor) == NUM_ACTORS and sum(per_actor.values()) == 16
    assert len(set(pool.actor_pids())) == NUM_ACTORS


def test_killed_actor_costs_only_its_episode(pool: RayEnvPool) -> None:
    async def run() -> list[dict[str, Any]]:
        return await asyncio.gather(
            _expert_episode(pool, ("b", 0), "valid_unseen", 0, kill_after=1),
            *[_expert_episode(pool, ("b", i), "valid_unseen", i * 9) for i in range(1, 9)],
        )

    before = pool.actors_replaced
    pids_before = set(pool.actor_pids())
    names_before = _env_actor_names()
    assert len(names_before) == NUM_ACTORS
    results = asyncio.run(run())
    failed = [r for r in results if "failed" in r]
    assert [r["id"] for r in failed] == [("b", 0)] and "died" in failed[0]["failed"]
    won = [r for r in results if r.get("won")]
    assert len(won) == 8
    assert pool.actors_replaced == before + 1
    # the replacement actor is alive and serves new episodes; the killed one is gone
    pids_after = set(pool.actor_pids())
    assert len(pids_after) == NUM_ACTORS and failed[0]["actor"] in pids_before - pids_after
    assert len(pids_after - pids_before) == 1
    # found by name from outside the pool: the killed actor's name is gone, its slot's next generation is there
    (gone,), (fresh,) = names_before - _env_actor_names(), _env_actor_names() - names_before
    slot, generation = gone.rsplit(":g", 1)
    assert fresh == f"{slot}:g{int(generation) + 1}" and slot.startswith("progpo_env:alfworld:")
    assert ray.get(ray.get_actor(fresh).pid.remote()) in pids_after
    assert asyncio.run(_expert_episode(pool, ("c", 0), "valid_seen", 1))["won"]


def _env_actor_names() -> set[str]:
    """Names of the live env actors (``progpo_env:<env>:<pool>:<slot>:g<generation>``)."""
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("progpo_env:")}


def test_pool_rejects_bad_arguments(pool: RayEnvPool) -> None:
    with pytest.raises(ValueError, match="unknown env 'nope'"):
        RayEnvPool("nope", {}, num_actors=1)
    with pytest.raises(ValueError, match="num_actors"):
        RayEnvPool("alfworld", {}, num_actors=0)

    async def run() -> None:
        with pytest.raises(ValueError, match="was not reset"):
            await pool.step("never", "look")
        with pytest.raises(ValueError, match="unknown ALFWorld split"):
            await pool.reset("bad-split", split="test", index=0)
        await pool.release("never")  # releasing an unknown episode is a no-op

    asyncio.run(run())


def test_actor_dead_before_reset_is_replaced_and_reset_retried(pool: RayEnvPool) -> None:
    async def run() -> dict[str, Any]:
        await pool.reset("first", split="valid_seen", index=3)
        idle_actor = pool.actor_handle("first")  # all actors idle: placement picks the same one
        await pool.release("first")
        ray.kill(idle_actor, no_restart=True)
        return await _expert_episode(pool, "second", "valid_seen", 3)

    before = pool.actors_replaced
    assert asyncio.run(run())["won"]
    assert pool.actors_replaced == before + 1


def test_unanswered_call_counts_as_dead_actor(pool: RayEnvPool) -> None:
    before, timeout = pool.actors_replaced, pool.call_timeout_s
    pool.actor_pids()  # every actor has started: only the call itself is timed below
    pool.call_timeout_s = 1e-3  # no reset answers within 1 ms: the actor counts as hung

    async def run() -> None:
        with pytest.raises(EnvFailure, match="died"):
            await pool.reset("slow", split="valid_seen", index=0)

    try:
        asyncio.run(run())
    finally:
        pool.call_timeout_s = timeout
    assert pool.actors_replaced == before + 2  # the reset was retried once on a fresh actor
    assert asyncio.run(_expert_episode(pool, "after-timeout", "valid_seen", 2))["won"]
