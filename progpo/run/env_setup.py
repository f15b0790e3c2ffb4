"""Build the env pool of a run from its :class:`~progpo.run.settings.EnvSettings` and the env's spec.

The env's spec (``progpo.envs``) says what to start (``service``: the WebShop server) and what the
env class takes; :func:`make_env_pool` is the one pool factory of both backends (``local`` threads,
``ray`` env actors, ``http`` async WebShop); :func:`open_env_pool` is what the local trainer, ``sft``
and ``evaluate`` call. Nothing here branches on the env name.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from progpo.envs import make_env, spec
from progpo.envs.local_pool import LocalEnvPool
from progpo.paths import data_root, require_path
from progpo.run.settings import EnvSettings

logger = logging.getLogger(__name__)


@dataclass
class EnvHandle:
    """What a run holds while its envs live.

    Attributes:
        pool: the ``EnvPool`` the episode loop drives.
        env_kwargs: constructor arguments of one env (``make_env(name, **env_kwargs)``).
        num_tasks: ``split -> number of tasks`` (asks a probe env).
        info: notes for the run log (e.g. the WebShop server URL).
    """

    pool: Any
    env_kwargs: dict[str, Any]
    num_tasks: Callable[[str], int]
    info: dict[str, Any]


@contextlib.contextmanager
def webshop_service(settings: EnvSettings) -> Iterator[dict[str, Any]]:
    """WebShop's spec ``service``: start a server on the data folder (unless ``--env.url``); yield env kwargs."""
    if settings.url:
        yield {"base_url": settings.url, "max_steps": settings.max_steps}
        return
    from envs.webshop_server.process import WebShopServerProcess

    subdir = settings.spec.data_subdir
    data = data_root(settings.data_dir) / subdir
    require_path(data, "WebShop data folder", f"Give --env.data_dir (a folder holding {subdir}/), set PROGPO_DATA, "
                 "or run: python -m progpo.cli.data download")
    with WebShopServerProcess(data_dir=data) as server:
        logger.info("WebShop server at %s", server.url)
        yield {"base_url": server.url, "max_steps": settings.max_steps}


@contextlib.contextmanager
def default_service(settings: EnvSettings) -> Iterator[dict[str, Any]]:
    """The service of an env spec without one: nothing to start; ``max_steps``, plus ``data_dir`` (the
    env's data folder under ``--env.data_dir``, None = the env's own default) when the spec has data."""
    kwargs: dict[str, Any] = {"max_steps": settings.max_steps}
    subdir = settings.spec.data_subdir
    if subdir is not None:
        kwargs["data_dir"] = None if settings.data_dir is None else str(Path(settings.data_dir).expanduser() / subdir)
    yield kwargs


def env_service(settings: EnvSettings) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """The context manager that starts what ``settings.name`` needs and yields its env kwargs."""
    env_spec = settings.spec
    return (env_spec.load("service") if env_spec.service else default_service)(settings)


def make_env_pool(name: str, env_kwargs: dict[str, Any], pool: str, *, max_envs: int, num_env_actors: int = 16,
                  num_cpus_per_actor: float = 0.25, episodes_per_actor: int = 1, call_timeout_s: float = 300.0,
                  start_timeout_s: float = 600.0) -> Any:
    """The ``EnvPool`` of kind ``pool`` over envs ``make_env(name, **env_kwargs)`` (imports only what it needs).

    Args:
        name: registered env id. env_kwargs: the env class's keyword arguments.
        pool: ``local`` (threads in this process), ``ray`` (one Ray actor per env) or ``http`` (WebShop
            over async HTTP). max_envs: envs alive at once (local/http).
        num_env_actors, num_cpus_per_actor, episodes_per_actor: the ray pool's actors.
        call_timeout_s, start_timeout_s: the ray pool's patience per env call and per actor start, in seconds.

    Raises:
        ValueError: an unknown pool, or ``http`` for an env that does not speak it.
    """
    if pool == "ray":
        from progpo.envs.ray_pool import RayEnvPool

        return RayEnvPool(name, env_kwargs, num_env_actors, num_cpus_per_actor, episodes_per_actor=episodes_per_actor,
                          call_timeout_s=call_timeout_s, start_timeout_s=start_timeout_s)
    if pool == "http":
        if spec(name).http_pool is None:
            raise ValueError(f"env.pool=http: env {name!r} is not served over HTTP (its spec names no http_pool; "
                             "use env.pool=ray)")
        return spec(name).load("http_pool")(env_kwargs, max_envs=max_envs)
    if pool == "local":
        return LocalEnvPool(functools.partial(make_env, name, **env_kwargs), max_envs=max_envs)
    raise ValueError(f"--env.pool must be local, ray or http, got {pool!r}")


def _num_tasks_fn(name: str, env_kwargs: dict[str, Any]) -> Callable[[str], int]:
    probe: list[Any] = []

    @functools.lru_cache(maxsize=None)
    def num_tasks(split: str) -> int:
        if not probe:
            probe.append(make_env(name, **env_kwargs))
        n = int(probe[0].num_tasks(split))
        if n < 1:
            raise ValueError(f"--env.train_split/--env.eval_split {split!r} of env {name!r} has no tasks")
        return n

    return num_tasks


@contextlib.contextmanager
def open_env_pool(settings: EnvSettings, max_envs: int) -> Iterator[EnvHandle]:
    """Context manager yielding an ``EnvHandle`` for ``settings``; stops what it started on exit.

    Args:
        settings: the run's ``EnvSettings`` (None fields are resolved from the env's spec; pool default local).
        max_envs: envs alive at once when ``settings.num_envs`` is 0 (local/http pools).
    """
    settings = settings.resolved(pool="local")
    spec(settings.name)
    with env_service(settings) as env_kwargs:
        pool = make_env_pool(settings.name, env_kwargs, settings.pool, max_envs=settings.num_envs or max_envs,
                             num_env_actors=settings.num_env_actors, num_cpus_per_actor=settings.num_cpus_per_actor,
                             episodes_per_actor=settings.episodes_per_actor, call_timeout_s=settings.call_timeout_s,
                             start_timeout_s=settings.start_timeout_s)
        handle = EnvHandle(pool=pool, env_kwargs=env_kwargs, num_tasks=_num_tasks_fn(settings.name, env_kwargs),
                           info={k: v for k, v in env_kwargs.items() if k == "base_url"})
        try:
            yield handle
        finally:
            import asyncio

            try:
                asyncio.run(pool.close())
            except RuntimeError as exc:  # closing inside a running loop: the caller closes the pool there
                logger.warning("env pool close skipped: %s", exc)
