"""Fault injection into a running CPU job through Ray (run by ``test_cpu_job_faults.py`` as a script).

``python tests/openrlhf/fault_injection.py kill-env-actor --address HOST:PORT --dump DIR``: connects to
the job's Ray cluster as a second driver, waits until one of the job's env actors (named
``progpo_env:<env>:<pool>:<slot>:g<generation>`` by ``progpo.envs.ray_pool``) hosts an episode, kills it
with ``ray.kill``, waits for the pool's replacement (same pool and slot, next generation), then, once the
job has written its first step batch (``DIR/iter001_step_batch.json``: iteration 1's rollout is over),
lists the env actors and asks each one for its pid. Prints one JSON line: ``killed``, ``replacement``,
``alive_after_iteration_1`` (names of the env actors that answered).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import ray

POLL_S = 0.2


def env_actors() -> dict[str, object]:
    """``name -> handle`` of every live env actor of every namespace."""
    found = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["name"].startswith("progpo_env:"):
            try:
                found[entry["name"]] = ray.get_actor(entry["name"], namespace=entry["namespace"])
            except ValueError:  # gone between the listing and the look-up
                continue
    return found


def poll(condition, what: str, deadline: float):
    """``condition()`` polled every ``POLL_S`` until truthy; TimeoutError naming ``what`` at ``deadline``."""
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within the deadline")
        time.sleep(POLL_S)


def busy_actor() -> tuple[str, object] | None:
    """An env actor hosting an episode right now, if any."""
    for name, actor in env_actors().items():
        try:
            if ray.get(actor.busy.remote(), timeout=60):
                return name, actor
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            continue
    return None


def kill_env_actor(address: str, dump: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    ray.init(address=address, log_to_driver=False)
    try:
        name, actor = poll(busy_actor, "an env actor hosting an episode", deadline)
        ray.kill(actor, no_restart=True)
        pool_slot, generation = name.rsplit(":g", 1)
        replacement = f"{pool_slot}:g{int(generation) + 1}"
        poll(lambda: replacement in env_actors(), f"the replacement {replacement}", deadline)
        poll(lambda: (dump / "iter001_step_batch.json").exists(), "the end of iteration 1's rollout", deadline)
        alive = []
        for n, a in env_actors().items():
            try:
                ray.get(a.pid.remote(), timeout=60)
                alive.append(n)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                continue
        return {"killed": name, "replacement": replacement, "alive_after_iteration_1": sorted(alive)}
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["kill-env-actor"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--dump", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    print(json.dumps(kill_env_actor(args.address, args.dump, args.timeout)), flush=True)


if __name__ == "__main__":
    main()
