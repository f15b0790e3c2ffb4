"""RayEnvPool where OpenRLHF builds it: inside an engine actor placed with placement-group capture.

OpenRLHF 0.11.2 creates each vLLM engine with ``placement_group_capture_child_tasks=True`` in a
bundle of ``{GPU: 1, CPU: 1}`` (colocated with the policy and reference actors, 0.2 of it each).
Our executor builds the env pool inside that engine, so the env actors must escape the group.
Here a 1-CPU bundle holds an "engine" actor of 0.6 CPU: inside the group only one 0.25-CPU env
actor would fit; outside it (3 CPUs in the cluster) all four do. Also: actors that cannot be placed
fail their episodes within the start timeout, the env's own failure kinds cross the actor boundary, and one
actor's death fails every episode it hosts and starts exactly one replacement.
Cost: one local Ray cluster (~6 s) and a few actor processes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

ray = pytest.importorskip("ray")

from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

from progpo.envs.base import EnvDataMissing, EnvNotStarted, EnvUnreachable  # noqa: E402
from progpo.envs.ray_pool import ActorDied, RayEnvPool  # noqa: E402
from progpo_tests.patience import PATIENCE_S, JsonHandler  # noqa: E402

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


VIEW = {"session_id": "s" * 24, "goal_index": 0, "instruction": "buy tea", "observation": "WebShop",
        "available_actions": {"has_search_bar": True, "clickables": ["search"]}, "url": "/x",
        "page": "index", "done": False, "reward": 0.0, "steps": 0, "valid": True, "message": ""}


@pytest.fixture
def step_hangs() -> Iterator[tuple[str, threading.Event]]:
    """A WebShop stand-in: a reset is answered at once, a step is held until the test ends.
    Yields its URL and an event set when the first step arrived."""
    arrived, release = threading.Event(), threading.Event()

    class Handler(JsonHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path.endswith("/step"):
                arrived.set()
                release.wait(PATIENCE_S)
            self.send_json(200, VIEW)

        def do_DELETE(self):
            self.send_json(200, {})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", arrived
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()


def test_an_actor_hosting_two_episodes_dies_once_and_is_replaced_once(cluster, step_hangs):
    """One actor hosts two episodes; it is killed while both step (one step in its env, the other queued on
    the actor behind it): both fail as died (``ActorDied``, kind ``env_actor_died``) and exactly one
    replacement starts (its slot's generation 1; a replacement per episode would start generation 2)."""
    url, arrived = step_hangs

    async def run():
        pool = RayEnvPool("webshop", {"base_url": url}, num_actors=1, episodes_per_actor=2)
        try:
            for e in ("a", "b"):
                await asyncio.wait_for(pool.reset(e, split="test", index=0), PATIENCE_S)
            host = pool.actor_handle("a")
            assert pool.actor_handle("b")._actor_id == host._actor_id  # noqa: SLF001 - one actor hosts both
            steps = [asyncio.ensure_future(pool.step(e, "search[tea]")) for e in ("a", "b")]
            assert await asyncio.to_thread(arrived.wait, PATIENCE_S)  # both sent; a's is in the env
            ray.kill(host, no_restart=True)
            failed = await asyncio.wait_for(asyncio.gather(*steps, return_exceptions=True), PATIENCE_S)
            prefix = pool.actor_name(0, 0)[: -len("g0")]
            names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                     if a["name"].startswith(prefix)}
            return failed, pool.actors_replaced, names, prefix
        finally:
            await pool.close()

    failed, replaced, names, prefix = asyncio.run(run())
    assert [type(f) for f in failed] == [ActorDied, ActorDied], failed
    assert all(f.kind == "env_actor_died" and "died" in str(f) for f in failed)
    assert replaced == 1 and names == {prefix + "g1"}
