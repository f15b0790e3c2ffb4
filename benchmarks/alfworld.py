"""``python -m benchmarks alfworld``: ALFWorld reset/step latency and Ray pool throughput.

Plays real json_2.1.1 games with a random admissible policy that never takes the actions that can
finish a task ("move ...", "use ..."), so every episode runs the full ``--env.max_steps`` steps.
Prints, for one process and for ``RayEnvPool`` at each ``--actors`` count: reset and step latency
(median and p90, as seen by the caller) and episodes per minute.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from dataclasses import dataclass, field

from benchmarks import cli
from progpo.envs.alfworld import AlfWorldEnv
from progpo.envs.spec import spec
from progpo.run.flags import comma_list
from progpo.run.settings import EnvSettings, TrainSettings


@dataclass(frozen=True)
class AlfWorldBench:
    """The flags of ``python -m benchmarks alfworld``: the env's own settings where the bench sets them."""

    env: EnvSettings = field(default_factory=lambda: EnvSettings(name="alfworld", max_steps=50),
                             metadata={"flags": ("data_dir", "max_steps", "num_cpus_per_actor")})
    split: str = field(default="valid_seen", metadata={"choices": lambda: spec("alfworld").splits})
    """ALFWorld split whose games are played"""
    single_episodes: int = 4
    """episodes in one process"""
    actors: str = "2,4,8"
    """comma-separated Ray pool sizes"""
    timed_episodes_per_actor: int = 2
    """timed episodes per actor (not --env.episodes_per_actor: each actor hosts one at a time)"""
    train: TrainSettings = field(default_factory=lambda: TrainSettings(seed=0), metadata={"flags": ("seed",)})

    def __post_init__(self) -> None:
        if min(self.actor_counts, default=0) < 1:
            raise ValueError(f"--actors entries must be >= 1, got {self.actors!r}")
        for name in ("single_episodes", "timed_episodes_per_actor"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")

    @property
    def actor_counts(self) -> list[int]:
        """``--actors`` as numbers.

        Raises:
            ValueError: an entry that is no integer, naming the flag.
        """
        try:
            return [int(a) for a in comma_list(self.actors, "--actors")]
        except ValueError as exc:
            raise ValueError(exc if str(exc).startswith("--actors") else
                             f"--actors must be comma-separated integers, got {self.actors!r}") from None


@dataclass
class _Timings:
    resets: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    episodes: int = 0
    wall_s: float = 0.0


def _pick(actions: list[str], rng: random.Random) -> str:
    safe = [a for a in actions if not a.startswith(("move ", "use "))]
    return rng.choice(safe or actions)


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _row(name: str, t: _Timings) -> str:
    epm = 60.0 * t.episodes / t.wall_s if t.wall_s > 0 else float("nan")
    return (
        f"{name:<18} {1e3 * statistics.median(t.resets):>9.0f} {1e3 * _quantile(t.resets, 0.9):>9.0f}"
        f" {1e3 * statistics.median(t.steps):>9.1f} {1e3 * _quantile(t.steps, 0.9):>9.1f}"
        f" {t.episodes:>5d} {t.wall_s:>8.1f} {epm:>8.2f}"
    )


def bench_single(args: AlfWorldBench, n_games: int) -> _Timings:
    """Episodes played one after another in this process (over the split's ``n_games`` games)."""
    env = AlfWorldEnv(data_dir=args.env.data_dir, max_steps=args.env.max_steps)
    rng = random.Random(args.train.seed)
    t = _Timings()
    env.reset(split=args.split, index=0)  # warm-up: imports and first parse
    start = time.perf_counter()
    for e in range(args.single_episodes):
        t0 = time.perf_counter()
        _, info = env.reset(split=args.split, index=e % n_games)
        t.resets.append(time.perf_counter() - t0)
        done = False
        while not done:
            t0 = time.perf_counter()
            res = env.step(_pick(info["admissible_actions"], rng))
            t.steps.append(time.perf_counter() - t0)
            info, done = res.info, res.done
        t.episodes += 1
    t.wall_s = time.perf_counter() - start
    env.close()
    return t


async def _pool_episodes(pool, workers: int, per_worker: int, args: AlfWorldBench, n_games: int,
                         t: _Timings) -> None:
    """``workers`` concurrent loops of ``per_worker`` episodes each; with ``workers`` equal to the
    number of actors no reset waits for a free actor, so latencies are the calls' own."""

    async def one(e: int) -> None:
        rng = random.Random(args.train.seed + e)
        t0 = time.perf_counter()
        _, info = await pool.reset(e, split=args.split, index=e % n_games)
        t.resets.append(time.perf_counter() - t0)
        done = False
        while not done:
            t0 = time.perf_counter()
            res = await pool.step(e, _pick(info["admissible_actions"], rng))
            t.steps.append(time.perf_counter() - t0)
            info, done = res.info, res.done
        await pool.release(e)
        t.episodes += 1

    async def worker(w: int) -> None:
        for k in range(per_worker):
            await one(w * per_worker + k)

    await asyncio.gather(*[worker(w) for w in range(workers)])


def bench_pool(args: AlfWorldBench, n_games: int, num_actors: int) -> _Timings:
    """``timed_episodes_per_actor`` episodes on each actor of a fresh ``RayEnvPool`` (timed after a
    warm-up wave that starts the actors and imports the game libraries)."""
    from progpo.envs.ray_pool import RayEnvPool

    kwargs = {"data_dir": args.env.data_dir, "max_steps": args.env.max_steps}
    pool = RayEnvPool("alfworld", kwargs, num_actors=num_actors,
                      num_cpus_per_actor=args.env.num_cpus_per_actor)
    t = _Timings()

    async def run() -> None:
        await _pool_episodes(pool, num_actors, 1, args, n_games, _Timings())  # warm-up
        start = time.perf_counter()
        await _pool_episodes(pool, num_actors, args.timed_episodes_per_actor, args, n_games, t)
        t.wall_s = time.perf_counter() - start
        await pool.close()

    asyncio.run(run())
    return t


def main(argv: list[str]) -> int:
    """Run the benchmark and print one table row per configuration (exit 2 on a bad flag, before any work)."""
    parser = cli.settings_parser(AlfWorldBench, "python -m benchmarks alfworld", __doc__)
    args = cli.parse(AlfWorldBench, parser, argv)

    n_games = AlfWorldEnv(data_dir=args.env.data_dir).num_tasks(args.split)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"ALFWorld bench: split={args.split} max_steps={args.env.max_steps} cpus={os.cpu_count()} "
          f"load1={load:.1f} policy=random admissible without move/use (episodes run to the limit)")
    print(f"{'config':<18} {'reset_ms':>9} {'reset_p90':>9} {'step_ms':>9} {'step_p90':>9}"
          f" {'eps':>5} {'wall_s':>8} {'eps/min':>8}")
    print(_row("single process", bench_single(args, n_games)), flush=True)
    for n in args.actor_counts:
        print(_row(f"ray pool x{n}", bench_pool(args, n_games, n)), flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"(latencies are per call as seen by the caller; load1 at end={load:.1f})")
    return 0
