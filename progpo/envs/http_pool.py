"""An ``EnvPool`` that talks to the WebShop server with async HTTP (httpx), for event-loop backends (the vLLM engine actors, the local trainer with --env.pool http).

OpenRLHF runs all rollouts of an engine as coroutines on the engine actor's event loop; a
blocking ``requests`` call there would stall every other rollout's generation. This pool keeps the
project's ``WebShopEnv`` semantics (observation, anchor observation, admissible actions, reward =
score x success_reward, truncation at ``max_steps``) and only swaps the transport: one shared
``httpx.AsyncClient`` (keep-alive connection pool) and ``await`` on every request.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx

from progpo.envs.base import EnvUnreachable, StepResult
from progpo.envs.webshop import CONNECT_RETRIES, SPLITS, WebShopEnv, _session_base, check_connect_retries


class RequestStats:
    """Counts HTTP requests of a pool: total, in flight now, and the peak number in flight at once."""

    def __init__(self) -> None:
        self.total = 0
        self.in_flight = 0
        self.peak_in_flight = 0

    def enter(self) -> None:
        self.total += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def exit(self) -> None:
        self.in_flight -= 1


class AsyncWebShopEnv(WebShopEnv):
    """``WebShopEnv`` with awaitable ``areset``/``astep``/``aclose`` over a shared ``httpx.AsyncClient``.

    The view-to-info translation (``_info``) is the parent's; only the HTTP calls differ.

    Args:
        client: the pool's ``httpx.AsyncClient`` (owned by the pool, not closed here).
        stats: shared request counters (the pool's ``stats``).
        base_url, max_steps, observation_mode, success_reward, timeout_s: as ``WebShopEnv``.
    """

    def __init__(self, client: httpx.AsyncClient, base_url: str, stats: RequestStats | None = None,
                 **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._client = client
        self._stats = stats or RequestStats()

    async def _acall(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self._stats.enter()
        try:
            r = await self._client.request(method, self._url(path), timeout=self.timeout_s, **kwargs)
        except httpx.HTTPError as e:
            raise EnvUnreachable(f"WebShop server at {self.base_url} unreachable: {e!r}") from e
        finally:
            self._stats.exit()
        return self._answer(path, r.status_code, r.text)

    async def areset(self, *, split: str, index: int | None = None, seed: int | None = None) -> tuple[str, dict]:
        """Async ``reset`` (same contract and errors as ``WebShopEnv.reset``)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        if index is None:
            if seed is None:
                raise ValueError("reset needs index or seed")
            sizes = dict((await self._acall("GET", "/health"))["splits"])
            index = self._index_from_seed(split, seed, sizes)
        await self.aclose()
        view = await self._acall("POST", "/api/sessions",
                                 json={"split": split, "index": index, "observation_mode": self.observation_mode})
        self._sid, self._task, self._task_id = view["session_id"], view["instruction"], str(view["goal_index"])
        self._session_base = _session_base(view)
        self._steps, self._done = 0, False
        self._last_obs = view["observation"]
        self._last_info = self._info(view, invalid=False)
        return self._last_obs, dict(self._last_info)

    async def astep(self, action: str) -> StepResult:
        """Async ``step`` (same contract as ``WebShopEnv.step``; never raises for a bad action)."""
        if self._sid is None:
            raise RuntimeError("call areset() before astep()")
        if self._done:
            return self._repeat_end()
        self._steps += 1
        try:
            view = await self._acall("POST", f"/api/sessions/{self._sid}/step",
                                     json={"action": str(action), "observation_mode": self.observation_mode})
        except ValueError as e:  # refused by the server (e.g. too long): an invalid no-op, as in step()
            return self._refused(e)
        return self._stepped(view)

    async def aclose(self) -> None:
        """Drop the server session (a dead server is ignored, as in ``close``)."""
        if self._sid is not None:
            sid, self._sid = self._sid, None
            try:
                await self._client.delete(self._url(f"/api/sessions/{sid}"), timeout=self.timeout_s)
            except httpx.HTTPError:
                pass
            self._session_base = None


class AsyncWebShopPool:
    """``EnvPool`` of :class:`AsyncWebShopEnv` sharing one keep-alive ``httpx.AsyncClient``.

    Args:
        base_url: the WebShop server.
        max_envs: at most this many sessions open at once; further ``reset`` calls wait.
        env_kwargs: more ``WebShopEnv`` arguments (``max_steps``, ``observation_mode``, ...);
            ``connect_retries`` sets the shared client's retries of refused connections (httpx's
            transport retries: connection errors only, backoff 0, 0.5, 1, 2, ... s).

    A restarted server fails the episodes whose sessions it lost (``EnvSessionLost``) and serves new
    ones on the same client (``WebShopEnv`` explains both).

    Attributes:
        stats: :class:`RequestStats` of all requests (``peak_in_flight > 1`` = requests overlapped).
    """

    def __init__(self, base_url: str, max_envs: int = 256, **env_kwargs: Any) -> None:
        if max_envs < 1:
            raise ValueError(f"max_envs must be >= 1, got {max_envs}")
        check_connect_retries(env_kwargs.get("connect_retries", CONNECT_RETRIES))
        self.base_url = base_url
        self.env_kwargs = env_kwargs
        self._client: httpx.AsyncClient | None = None
        self._envs: dict[Any, AsyncWebShopEnv] = {}
        self._slots = asyncio.Semaphore(max_envs)
        self._max_envs = max_envs
        self.stats = RequestStats()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=self._max_envs, max_keepalive_connections=self._max_envs)
            retries = self.env_kwargs.get("connect_retries", CONNECT_RETRIES)
            self._client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(limits=limits, retries=retries))
        return self._client

    async def reset(self, episode_id: Any, *, split: str, index: int | None = None, seed: int | None = None):
        if episode_id in self._envs:
            raise ValueError(f"episode_id {episode_id!r} is already running")
        await self._slots.acquire()
        env = AsyncWebShopEnv(self._http(), self.base_url, stats=self.stats, **self.env_kwargs)
        self._envs[episode_id] = env
        try:
            return await env.areset(split=split, index=index, seed=seed)
        except BaseException:
            await self.release(episode_id)
            raise

    async def step(self, episode_id: Any, action: str) -> StepResult:
        env = self._envs.get(episode_id)
        if env is None:
            raise ValueError(f"episode_id {episode_id!r} was not reset")
        return await env.astep(action)

    async def release(self, episode_id: Any) -> None:
        env = self._envs.pop(episode_id, None)
        if env is not None:
            try:
                await env.aclose()
            finally:
                self._slots.release()

    async def close(self) -> None:
        for eid in list(self._envs):
            await self.release(eid)
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def make_async_http_pool(env_kwargs: dict[str, Any], max_envs: int = 256) -> AsyncWebShopPool:
    """The async HTTP pool of WebShop (its env spec's ``http_pool``).

    Raises:
        ValueError: no ``base_url`` in ``env_kwargs``.
    """
    kwargs = dict(env_kwargs)
    if "base_url" not in kwargs:
        raise ValueError("env.pool=http needs the WebShop server URL (--env.url)")
    kwargs.pop("data_dir", None)
    return AsyncWebShopPool(kwargs.pop("base_url"), max_envs=max_envs, **kwargs)
