"""Build the env pool of a run: start what the env needs (WebShop server), pick local or Ray pool.

One small setup function per env name in ``ENV_SETUPS`` (the only place that knows env-specific
constructor arguments); the trainer calls ``open_env_pool(settings, max_envs)`` and never branches
on the env name.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from progpo.envs import make_env
from progpo.paths import data_root, require_path
from progpo.envs.local_pool import LocalEnvPool

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
def _webshop(settings) -> Iterator[dict[str, Any]]:
    """Start a WebShop server on ``settings.data_dir`` (unless ``--env.webshop_url``); yield env kwargs."""
    if settings.webshop_url:
        yield {"base_url": settings.webshop_url, "max_steps": settings.max_steps}
        return
    from envs.webshop_server.process import WebShopServerProcess

    data = data_root(settings.data_dir) / "webshop"
    require_path(data, "WebShop data folder", "Give --env.data_dir (a folder holding webshop/), set PROGPO_DATA, "
                 "or run: python -m progpo.cli.data download")
    with WebShopServerProcess(data_dir=data) as server:
        logger.info("WebShop server at %s", server.url)
        yield {"base_url": server.url, "max_steps": settings.max_steps}


@contextlib.contextmanager
def _alfworld(settings) -> Iterator[dict[str, Any]]:
    """ALFWorld needs no service: yield env kwargs (games unpacked once by the env's data module)."""
    data = None if settings.data_dir is None else str(Path(settings.data_dir).expanduser() / "alfworld")
    yield {"data_dir": data, "max_steps": settings.max_steps}


ENV_SETUPS: dict[str, Callable[[Any], contextlib.AbstractContextManager]] = {
    "webshop": _webshop,
    "alfworld": _alfworld,
}


def _num_tasks_fn(name: str, env_kwargs: dict[str, Any]) -> Callable[[str], int]:
    probe: list[Any] = []

    @functools.lru_cache(maxsize=None)
    def num_tasks(split: str) -> int:
        if not probe:
            probe.append(make_env(name, **env_kwargs))
        env = probe[0]
        if hasattr(env, "num_tasks"):
            n = int(env.num_tasks(split))
        elif hasattr(env, "split_sizes"):
            sizes = env.split_sizes()
            if split not in sizes:
                raise ValueError(f"--env.train_split/--env.eval_split {split!r} is not a split of {name!r} ({sorted(sizes)})")
            n = int(sizes[split])
        else:
            raise ValueError(f"env {name!r} reports neither num_tasks(split) nor split_sizes()")
        if n < 1:
            raise ValueError(f"--env.train_split/--env.eval_split {split!r} of env {name!r} has no tasks")
        return n

    return num_tasks


@contextlib.contextmanager
def open_env_pool(settings, max_envs: int) -> Iterator[EnvHandle]:
    """Context manager yielding an ``EnvHandle`` for ``settings`` (``EnvSettings``); cleans up on exit.

    Args:
        settings: the run's ``EnvSettings`` (name, data_dir, pool, ...).
        max_envs: envs alive at once when ``settings.num_envs`` is 0.
    """
    if settings.name not in ENV_SETUPS:
        raise ValueError(f"--env.name must be one of {sorted(ENV_SETUPS)}, got {settings.name!r}")
    n_envs = settings.num_envs or max_envs
    with ENV_SETUPS[settings.name](settings) as env_kwargs:
        if settings.pool == "ray":
            from progpo.envs.ray_pool import RayEnvPool

            pool = RayEnvPool(settings.name, env_kwargs, num_actors=n_envs, num_cpus_per_actor=0.5)
        else:
            # Thread-unsafe libraries (TextWorld) serialise their own calls (AlfWorldEnv's lock).
            pool = LocalEnvPool(functools.partial(make_env, settings.name, **env_kwargs), max_envs=n_envs)
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
