"""An ``EnvPool`` of Ray actors: env episodes run in other processes, so slow resets overlap.

Each actor is a separate process holding up to ``episodes_per_actor`` environments of any
registered name (``progpo.envs.make_env``). The pool assigns a starting episode to the least
loaded live actor and keeps it there until ``release``. Calls to different actors run in
parallel (ALFWorld's slow resets overlap across actors, CPU permitting; timings: docs/alfworld.md,
"The env" and "Benchmark"); calls to one actor run one at a time.

Each actor is named ``progpo_env:<env>:<pool id>:<slot>:g<generation>`` (:meth:`RayEnvPool.actor_name`),
so that monitoring and failure tests find it through Ray (``ray.util.list_named_actors``); a
replacement takes its slot's next generation.

Placement: the actors never join the placement group of the process that creates them. OpenRLHF
creates its vLLM engines with ``placement_group_capture_child_tasks=True``; an env pool built inside
an engine would otherwise be captured into the engine's GPU bundle, where a handful of 0.25-CPU actors
fit at most and the rest wait forever. Each actor is scheduled with a soft node affinity to the
creating process's node (env actors beside their engine when the node has room, elsewhere if not).

Failure handling: every remote call has a finite timeout. An actor that has not started within
``start_timeout_s`` of its creation fails the episodes placed on it with ``EnvNotStarted`` (no
replacement: one would not fit either). When a started actor dies (crash, OOM kill, ``ray.kill``) or
does not answer within ``call_timeout_s``, every episode it hosted raises ``EnvFailure``
(``ActorDied``) on its next call, and the pool starts a fresh actor in its place, so the run
continues; a reset that meets a dead actor is retried once on the replacement. A ``ValueError``
raised by the env (bad user input such as an unknown split) is re-raised as ``ValueError``; a
``FileNotFoundError`` (the env's data folder is missing on that node) becomes ``EnvDataMissing``;
any other exception in the env becomes ``EnvFailure`` for that episode only (the actor stays).

This is the only module of ``progpo.envs`` that imports ``ray``.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from progpo.envs import env_class, make_env, spec
from progpo.envs.base import EnvDataMissing, EnvFailure, EnvNotStarted, StepResult
from progpo.paths import REPO_ROOT

logger = logging.getLogger(__name__)


class _EnvHost:
    """The actor body: a few envs of one kind, keyed by the pool's episode keys."""

    def __init__(self, env_name: str, env_kwargs: dict[str, Any]) -> None:
        self._env_name = env_name
        self._env_kwargs = env_kwargs
        self._free: list[Any] = []
        self._busy: dict[int, Any] = {}

    def reset(self, key: int, split: str, index: int | None, seed: int | None) -> tuple[str, dict]:
        env = self._busy.get(key)
        if env is None:
            env = self._free.pop() if self._free else make_env(self._env_name, **self._env_kwargs)
            self._busy[key] = env
        return env.reset(split=split, index=index, seed=seed)

    def step(self, key: int, action: str) -> StepResult:
        env = self._busy.get(key)
        if env is None:
            raise KeyError(f"env key {key} was not reset on this actor")
        return env.step(action)

    def release(self, key: int) -> None:
        env = self._busy.pop(key, None)
        if env is not None:
            self._free.append(env)

    def pid(self) -> int:
        return os.getpid()

    def busy(self) -> int:
        """Episodes this actor hosts now (reset and not yet released)."""
        return len(self._busy)

    def placement(self) -> dict[str, Any]:
        """Where this actor runs: ``pid``, ``node_id`` and ``placement_group`` (its id, None outside any)."""
        pg = ray.util.get_current_placement_group()
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "placement_group": None if pg is None else pg.id.hex()}

    def close(self) -> None:
        for env in self._free + list(self._busy.values()):
            env.close()
        self._free.clear()
        self._busy.clear()


class ActorDied(EnvFailure):
    """The env actor behind an episode died or stopped answering (a kind of ``EnvFailure``)."""

    kind: ClassVar[str] = "env_actor_died"


@dataclass
class _Slot:
    actor: Any
    ready: Any = None  # ObjectRef of the actor's first call (pid): resolves once it runs
    created_at: float = field(default_factory=time.monotonic)
    started: bool = False
    load: int = 0
    generation: int = 0


@dataclass(frozen=True)
class _Episode:
    slot: int
    generation: int
    key: int


def _check_env_kwargs(env_name: str, env_kwargs: Any) -> None:
    """ValueError naming ``env_kwargs`` keys the env class does not take (caught here, not in every
    actor's first reset, where each episode would fail on its own)."""
    if env_kwargs is None:
        return
    if not isinstance(env_kwargs, dict):
        raise ValueError(f"env_kwargs must be a dict of {env_name} env arguments, got {type(env_kwargs).__name__}")
    try:
        inspect.signature(env_class(env_name)).bind(**env_kwargs)
    except TypeError as exc:
        raise ValueError(f"env_kwargs {sorted(env_kwargs)} do not fit the {env_name} env: {exc}") from None


class RayEnvPool:
    """``EnvPool`` (``progpo.envs.base``) over ``num_actors`` Ray actors.

    Args:
        env_name: a registered env id (``progpo.envs``; e.g. "alfworld", "webshop").
        env_kwargs: keyword arguments of the env class (e.g. ``{"max_steps": 50}``).
        num_actors: actor processes to keep alive.
        num_cpus_per_actor: Ray CPU resource per actor (fractional: 0.25 packs 4 actors per core).
        episodes_per_actor: episodes one actor hosts at once; further ``reset`` calls wait for a
            free place (default 1: an actor's death costs exactly one episode).
        call_timeout_s: seconds to wait for one reset/step of a started actor before it counts
            as dead (finite: a stuck env fails its episode instead of stalling the batch).
        start_timeout_s: seconds from an actor's creation until it must have started (placed
            and constructed); past it, its episodes fail with ``EnvNotStarted``.
        ray_init_kwargs: passed to ``ray.init`` when Ray is not running yet (defaults: enough
            CPUs for the actors, no dashboard, this repository on the workers' PYTHONPATH).

    Raises:
        ValueError: unknown ``env_name``, a non-positive count/resource, or a timeout that is not
            a finite number of seconds > 0.
    """

    def __init__(
        self,
        env_name: str,
        env_kwargs: dict[str, Any] | None = None,
        num_actors: int = 4,
        num_cpus_per_actor: float = 0.25,
        *,
        episodes_per_actor: int = 1,
        call_timeout_s: float = 300.0,
        start_timeout_s: float = 600.0,
        ray_init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        spec(env_name)  # ValueError naming the registered envs
        _check_env_kwargs(env_name, env_kwargs)
        for name, value in (("num_actors", num_actors), ("episodes_per_actor", episodes_per_actor)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not num_cpus_per_actor > 0:
            raise ValueError(f"num_cpus_per_actor must be > 0, got {num_cpus_per_actor}")
        for name, value in (("call_timeout_s", call_timeout_s), ("start_timeout_s", start_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        self.env_name = env_name
        self.env_kwargs = dict(env_kwargs or {})
        self.num_actors = num_actors
        self.num_cpus_per_actor = float(num_cpus_per_actor)
        self.episodes_per_actor = episodes_per_actor
        self.call_timeout_s = float(call_timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.actors_replaced = 0
        self._owns_ray = False
        if not ray.is_initialized():
            ray.init(**self._default_init_kwargs(ray_init_kwargs))
            self._owns_ray = True
        self._actor_cls = ray.remote(_EnvHost)
        self._uid = uuid.uuid4().hex[:8]
        self._slots = [self._new_slot(i, 0) for i in range(num_actors)]
        self._episodes: dict[Any, _Episode] = {}
        self._keys = itertools.count()
        self._changed: asyncio.Condition | None = None
        self._changed_loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # ---- setup -----------------------------------------------------------------------------
    def _default_init_kwargs(self, extra: dict[str, Any] | None) -> dict[str, Any]:
        need = math.ceil(self.num_actors * self.num_cpus_per_actor)
        pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
        kwargs: dict[str, Any] = {
            "num_cpus": max(os.cpu_count() or 1, need),
            "include_dashboard": False,
            "runtime_env": {"env_vars": {"PYTHONPATH": pythonpath}},
        }
        kwargs.update(extra or {})
        return kwargs

    def actor_name(self, slot_idx: int, generation: int) -> str:
        """The Ray name of the actor in ``slot_idx`` after ``generation`` replacements:
        ``progpo_env:<env>:<pool id>:<slot>:g<generation>`` (in the creating job's namespace; find them
        with ``ray.util.list_named_actors``, or ``ray list actors`` where the dashboard runs)."""
        return f"progpo_env:{self.env_name}:{self._uid}:{slot_idx}:g{generation}"

    def _new_slot(self, slot_idx: int, generation: int) -> _Slot:
        actor = self._actor_cls.options(num_cpus=self.num_cpus_per_actor, max_restarts=0,
                                        name=self.actor_name(slot_idx, generation),
                                        scheduling_strategy=env_actor_strategy()).remote(self.env_name, self.env_kwargs)
        return _Slot(actor, ready=actor.pid.remote(), generation=generation)

    def _condition(self) -> asyncio.Condition:
        # An asyncio.Condition binds to one event loop: make one per loop that drives the pool.
        loop = asyncio.get_running_loop()
        if self._changed is None or self._changed_loop is not loop:
            self._changed = asyncio.Condition()
            self._changed_loop = loop
        return self._changed

    # ---- failures --------------------------------------------------------------------------
    def _replace_actor(self, slot_idx: int, generation: int, reason: str) -> None:
        """Start a fresh actor in ``slot_idx`` unless another caller already did."""
        slot = self._slots[slot_idx]
        if slot.generation != generation or self._closed:
            return
        logger.warning("env actor %d died (%s); starting a replacement", slot_idx, reason)
        try:
            ray.kill(slot.actor, no_restart=True)
        except (RayActorError, ValueError) as exc:  # already gone
            logger.debug("ray.kill of dead actor %d: %s", slot_idx, exc)
        fresh = self._new_slot(slot_idx, slot.generation + 1)
        slot.actor, slot.ready, slot.created_at, slot.started = fresh.actor, fresh.ready, fresh.created_at, False
        slot.generation = fresh.generation
        slot.load = 0  # the dead actor's episodes fail on their next call and free nothing here
        self.actors_replaced += 1

    async def _await_start(self, slot_idx: int, slot: _Slot) -> None:
        """Wait until the slot's actor runs, at most ``start_timeout_s`` after its creation.

        Raises:
            EnvNotStarted: it was not placed/constructed in time (names what it asks for).
            ActorDied: it died while starting.
        """
        left = self.start_timeout_s - (time.monotonic() - slot.created_at)
        try:
            await asyncio.wait_for(asyncio.wrap_future(slot.ready.future()), max(left, 1e-3))
        except (asyncio.TimeoutError, GetTimeoutError):
            free = ray.available_resources().get("CPU", 0.0)
            raise EnvNotStarted(
                f"{self.env_name} env actor {slot_idx} not started within {self.start_timeout_s:g} s "
                f"(it asks for {self.num_cpus_per_actor:g} CPU outside any placement group; the cluster has "
                f"{free:g} CPU free)") from None
        except RayActorError as exc:
            raise ActorDied(f"{self.env_name} env actor {slot_idx} died while starting ({exc!r})") from exc
        slot.started = True

    async def _call(self, episode_id: Any, ep: _Episode, method: str, *args: Any) -> Any:
        slot = self._slots[ep.slot]
        if slot.generation != ep.generation:
            raise ActorDied(f"episode {episode_id!r}: its env actor {ep.slot} died earlier")
        try:
            if not slot.started:
                await self._await_start(ep.slot, slot)
            ref = getattr(slot.actor, method).remote(ep.key, *args)
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), self.call_timeout_s)
        except (RayActorError, asyncio.TimeoutError, GetTimeoutError, ActorDied) as exc:
            self._replace_actor(ep.slot, ep.generation, type(exc).__name__)
            async with self._condition():
                self._condition().notify_all()
            raise ActorDied(f"episode {episode_id!r}: env actor {ep.slot} died ({exc!r})") from exc
        except RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, ValueError):
                raise cause from None
            if isinstance(exc.cause, FileNotFoundError):
                raise EnvDataMissing(f"{self.env_name} env data not found on its actor's node: {exc.cause}") from exc
            kind = type(exc.cause) if isinstance(exc.cause, EnvFailure) else EnvFailure  # keep the env's own kind
            raise kind(f"episode {episode_id!r}: env raised in {method}: {exc.cause}") from exc

    # ---- EnvPool protocol ------------------------------------------------------------------
    async def reset(
        self, episode_id: Any, *, split: str, index: int | None = None, seed: int | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Assign ``episode_id`` to the least loaded actor (waiting for room) and reset its env.

        An actor found dead at reset (it died between episodes) is replaced and the reset is
        retried once on the replacement, so no episode is lost to it.

        Raises:
            ValueError: ``episode_id`` is already running, or the env rejected the arguments.
            EnvFailure: the env failed during reset, or actors died twice in a row.
        """
        if self._closed:
            raise RuntimeError("RayEnvPool is closed")
        if episode_id in self._episodes:
            raise ValueError(f"episode_id {episode_id!r} is already running")
        try:
            return await self._reset_once(episode_id, split, index, seed)
        except ActorDied:
            logger.warning("episode %r: its actor died before reset; retrying once", episode_id)
        return await self._reset_once(episode_id, split, index, seed)

    async def _reset_once(
        self, episode_id: Any, split: str, index: int | None, seed: int | None
    ) -> tuple[str, dict[str, Any]]:
        ep = await self._place(episode_id)
        try:
            return await self._call(episode_id, ep, "reset", split, index, seed)
        except BaseException:
            await self.release(episode_id)
            raise

    async def _place(self, episode_id: Any) -> _Episode:
        """Put ``episode_id`` on the least loaded actor, waiting until one has room."""
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: min(s.load for s in self._slots) < self.episodes_per_actor)
            slot_idx = min(range(len(self._slots)), key=lambda i: self._slots[i].load)
            slot = self._slots[slot_idx]
            slot.load += 1
            ep = _Episode(slot_idx, slot.generation, next(self._keys))
            self._episodes[episode_id] = ep
        return ep

    async def step(self, episode_id: Any, action: str) -> StepResult:
        """Step the env of ``episode_id``.

        Raises:
            ValueError: ``episode_id`` was not reset. EnvFailure: its actor or env failed.
        """
        ep = self._episodes.get(episode_id)
        if ep is None:
            raise ValueError(f"episode_id {episode_id!r} was not reset")
        return await self._call(episode_id, ep, "step", action)

    async def release(self, episode_id: Any) -> None:
        """Free the place of ``episode_id`` (its env is kept for reuse); never raises for a dead actor."""
        ep = self._episodes.pop(episode_id, None)
        if ep is None:
            return
        slot = self._slots[ep.slot]
        if slot.generation == ep.generation:
            slot.load -= 1
            slot.actor.release.remote(ep.key)  # fire and forget: calls to one actor stay ordered
        cond = self._condition()
        async with cond:
            cond.notify_all()

    async def close(self) -> None:
        """Close every env, kill the actors, and shut Ray down if this pool started it."""
        if self._closed:
            return
        self._closed = True
        refs = [s.actor.close.remote() for s in self._slots if s.started]  # one never started has no env
        try:
            await asyncio.wait_for(asyncio.gather(*refs, return_exceptions=True), timeout=min(30.0, self.call_timeout_s))
        except asyncio.TimeoutError:
            logger.warning("env actors did not close within %g s; killing them", min(30.0, self.call_timeout_s))
        for s in self._slots:
            ray.kill(s.actor, no_restart=True)
        self._episodes.clear()
        if self._owns_ray:
            ray.shutdown()

    # ---- introspection ---------------------------------------------------------------------
    def actor_handle(self, episode_id: Any) -> Any:
        """The Ray actor hosting ``episode_id`` (for monitoring and failure tests).

        Raises:
            ValueError: ``episode_id`` is not running.
        """
        ep = self._episodes.get(episode_id)
        if ep is None:
            raise ValueError(f"episode_id {episode_id!r} is not running")
        return self._slots[ep.slot].actor

    def actor_pids(self) -> list[int]:
        """Process ids of the current actors (blocks, at most ``start_timeout_s + call_timeout_s``).

        Raises:
            ray.exceptions.GetTimeoutError: an actor did not answer in time.
        """
        return ray.get([s.actor.pid.remote() for s in self._slots],
                       timeout=self.start_timeout_s + self.call_timeout_s)


def env_actor_strategy() -> Any:
    """Scheduling strategy of a new env actor: never inside the caller's placement group.

    A soft affinity to the calling process's node (a vLLM engine actor's, the driver's): env actors
    run beside their engine when that node has room, anywhere else otherwise. Ray captures a child
    into its parent's placement group (``placement_group_capture_child_tasks``, as OpenRLHF places
    its engines) only when the child gives no strategy or a placement-group one; this one is neither.
    """
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
