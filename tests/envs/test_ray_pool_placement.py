"""RayEnvPool where OpenRLHF builds it: inside an engine actor placed with placement-group capture.

OpenRLHF 0.11.2 creates each vLLM engine with ``placement_group_capture_child_tasks=True`` in a
bundle of ``{GPU: 1, CPU: 1}`` (colocated with the policy and reference actors, 0.2 of it each).
Our executor builds the env pool inside that engine, so the env actors must escape the group.
Here a 1-CPU bundle holds an "engine" actor of 0.6 CPU: inside the group only one 0.25-CPU env
actor would fit; outside it (3 CPUs in the cluster) all four do. Also: actors that cannot be placed
fail their episodes within the start timeout, the env's own failure kinds cross the actor boundary.
Cost: one local Ray cluster (~6 s) and a few actor processes.
"""

from __future__ import annotations

import asyncio

import pytest

ray = pytest.importorskip("ray")

from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

from progpo.envs.base import EnvDataMissing, EnvNotStarted, EnvUnreachable  # noqa: E402
from progpo.envs.ray_pool import RayEnvPool  # noqa: E402
from progpo.testing import PATIENCE_S  # noqa: E402

CLOSED_URL = "http://127.0.0.1:9"  # discard port: nothing listens there


@pytest.fixture(scope="module")
def cluster():
    assert not ray.is_initialized()
    ray.init(address="local", num_cpus=3, num_gpus=0, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote
class Engine:
    """Stands in for OpenRLHF's RolloutRayActor: builds the env pool inside itself, as our executor does."""

    def start_pool(self, num_actors: int) -> list[dict]:
        pool = RayEnvPool("webshop", {"base_url": CLOSED_URL}, num_actors=num_actors, num_cpus_per_actor=0.25)
        pids = pool.actor_pids()  # every actor answers: all were placed and started
        where = ray.get([s.actor.placement.remote() for s in pool._slots], timeout=PATIENCE_S)
        asyncio.run(pool.close())
        assert sorted(w["pid"] for w in where) == sorted(pids)
        return where

    def own_group(self) -> str:
        return ray.util.get_current_placement_group().id.hex()


def test_env_actors_built_inside_a_captured_engine_start_outside_its_group(cluster):
    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready(), timeout=PATIENCE_S)
    try:
        engine = Engine.options(num_cpus=0.6, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_capture_child_tasks=True, placement_group_bundle_index=0)).remote()
        assert ray.get(engine.own_group.remote(), timeout=PATIENCE_S) == pg.id.hex()
        where = ray.get(engine.start_pool.remote(4), timeout=PATIENCE_S)
        assert len(where) == 4 and len({w["pid"] for w in where}) == 4
        assert all(w["placement_group"] is None for w in where), where  # none captured into the engine's bundle
        ray.kill(engine)
    finally:
        remove_placement_group(pg)


def test_actors_that_cannot_start_fail_their_episodes_within_the_start_timeout(cluster):
    async def run():
        pool = RayEnvPool("webshop", {"base_url": CLOSED_URL}, num_actors=1, num_cpus_per_actor=64,
                          start_timeout_s=2)  # 64 CPUs: never placed on this 3-CPU cluster
        try:
            with pytest.raises(EnvNotStarted, match=r"not started within 2 s .*asks for 64 CPU") as exc:
                await asyncio.wait_for(pool.reset("e", split="test", index=0), PATIENCE_S)
            assert exc.value.kind == "env_not_started" and pool.actors_replaced == 0
        finally:
            await pool.close()

    asyncio.run(run())


def test_the_envs_own_failure_kinds_cross_the_actor_boundary(cluster, tmp_path):
    async def run():
        pool = RayEnvPool("webshop", {"base_url": CLOSED_URL, "connect_retries": 0}, num_actors=1)
        missing = RayEnvPool("alfworld", {"data_dir": str(tmp_path / "no_such_folder")}, num_actors=1)
        try:
            with pytest.raises(EnvUnreachable, match=f"WebShop server at {CLOSED_URL} unreachable"):
                await asyncio.wait_for(pool.reset("w", split="test", index=0), PATIENCE_S)
            with pytest.raises(EnvDataMissing, match="no_such_folder"):
                await asyncio.wait_for(missing.reset("a", split="valid_seen", index=0), PATIENCE_S)
        finally:
            await pool.close()
            await missing.close()

    asyncio.run(run())


@pytest.mark.parametrize("kwargs", [{"call_timeout_s": None}, {"call_timeout_s": float("inf")},
                                    {"start_timeout_s": 0}])
def test_every_call_has_a_finite_timeout(kwargs):
    with pytest.raises(ValueError, match="finite number of seconds"):
        RayEnvPool("webshop", {"base_url": CLOSED_URL}, num_actors=1, **kwargs)
