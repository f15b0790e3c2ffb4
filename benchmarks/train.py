"""``python -m benchmarks train``: one training iteration's time split, per estimator.

Builds the real trainer (SmolLM2-135M-Instruct by default, CPU, DeepSpeed actor, WebShop server on
the real products), plays ONE rollout (tasks x rollouts x max steps) and then, for every estimator,
runs the advantage stage and one update on those same episodes. The rollout does not depend on the
estimator (all start from the same weights), so its generate / env times are measured once and
shared; advantages and update are timed per estimator. Prints a table: generate, env, advantages,
update (seconds), steps/s over the whole iteration, and the advantages' share of the iteration
(target: < 5%).
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks import cli
from progpo.advantages import Estimator
from progpo.run.flags import comma_list
from progpo.run.settings import EnvSettings, RolloutSettings, TrainSettings
from progpo.trainer.config import CkptSettings, LoggerSettings, TrainConfig
from progpo.trainer.settings import ActorSettings


def train_section(section: str, **changes: Any) -> Any:
    """``train``'s default of its settings section ``section`` (the ``TrainConfig`` field: ``rollout``, ``env`` ...)
    with a bench's ``changes``: a bench's default differs from ``train``'s only where it says so."""
    f = next(f for f in dataclasses.fields(TrainConfig) if f.name == section)
    return dataclasses.replace(f.default_factory(), **changes)


def train_config(ckpt_path: str | None, **sections: Any) -> TrainConfig:
    """``train``'s config of a bench run: the bench's ``sections`` (``env=``, ``rollout=``, ``actor=`` ...) in place of
    ``train``'s defaults, the env resolved as ``train`` resolves it, run folder ``ckpt_path``, no TensorBoard events
    and no progress bar.

    Raises:
        ValueError: a combination ``train`` refuses, naming the flag.
    """
    if "env" in sections:
        sections["env"] = sections["env"].resolved(pool="local")
    return TrainConfig(ckpt=CkptSettings(path=ckpt_path), logger=LoggerSettings(tensorboard_dir=None, progress_bar=False),
                       **sections)


@dataclass(frozen=True)
class TrainBench:
    """The flags of ``python -m benchmarks train``: ``train``'s own settings, at a small batch."""

    actor: ActorSettings = field(default_factory=lambda: train_section("actor"),
                                 metadata={"flags": ("model_name_or_path",)})
    env: EnvSettings = field(default_factory=lambda: train_section("env", max_steps=5),
                             metadata={"flags": ("name", "max_steps")})
    rollout: RolloutSettings = field(
        default_factory=lambda: train_section("rollout", batch_size=2, n_samples_per_prompt=4, max_new_tokens=64),
        metadata={"flags": ("batch_size", "n_samples_per_prompt", "max_new_tokens")})
    train: TrainSettings = field(default_factory=lambda: train_section("train", micro_batch_size=2),
                                 metadata={"flags": ("micro_batch_size",)})
    estimators: str = ",".join(e.value for e in Estimator)
    """comma-separated estimators timed, each on the same rollout's episodes"""

    def __post_init__(self) -> None:
        known = [e.value for e in Estimator]
        unknown = [name for name in self.names if name not in known]
        if unknown or not self.names:
            raise ValueError(f"--estimators must name estimators among {', '.join(known)}, got {self.estimators!r}")
        self.train_config(None)  # train's own checks of these settings, before any model is loaded

    @property
    def names(self) -> list[str]:
        """The estimators of ``--estimators``, in order."""
        return comma_list(self.estimators, "--estimators")

    def train_config(self, ckpt_path: str | None) -> TrainConfig:
        """``train``'s config of this run: every sample of the rollout in one optimizer step."""
        return train_config(ckpt_path, actor=self.actor, env=self.env, rollout=self.rollout,
                            train=dataclasses.replace(self.train, batch_size=1_000_000))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table (exit code 0; 2 on a bad flag, before any model is loaded)."""
    parser = cli.settings_parser(TrainBench, "python -m benchmarks train", __doc__.split("\n")[0])
    args = cli.parse(TrainBench, parser, argv)

    from progpo.advantages import AdvantageConfig
    from progpo.run.process import setup_logging
    from progpo.run.env_setup import open_env_pool
    from progpo.trainer.loop import Trainer

    setup_logging("WARNING")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwind: stop the WebShop server
    names = args.names
    with tempfile.TemporaryDirectory(prefix="progpo-bench-train-") as tmp:
        cfg = args.train_config(tmp)
        trainer = Trainer(cfg)
        loop = asyncio.new_event_loop()
        rows = []
        with open_env_pool(cfg.env, cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt) as envs:
            trainer.envs = envs
            t0 = time.perf_counter()
            trainer._build(envs)
            build_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            roll = trainer.rollout(1, loop)
            rollout_s = time.perf_counter() - t0
            gen_s = roll.metrics["perf/generate_s"]
            env_s = max(rollout_s - gen_s, 0.0)
            n_steps = roll.metrics["rollout/num_steps"]
            for name in names:
                algo = dataclasses.replace(cfg.algo, advantage=dataclasses.replace(cfg.algo.advantage, estimator=name))
                trainer.cfg = dataclasses.replace(cfg, algo=algo,
                                                  progpo=AdvantageConfig(estimator=name, max_steps=cfg.env.max_steps))
                t0 = time.perf_counter()
                samples, _ = trainer.advantages(roll.episodes)
                adv_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                trainer.update(samples)
                upd_s = time.perf_counter() - t0
                total = rollout_s + adv_s + upd_s
                rows.append((name, gen_s, env_s, adv_s, upd_s, n_steps / total, 100 * adv_s / total))
        loop.close()
    print(f"train iteration time split | model {cfg.actor.model_name_or_path} | env {cfg.env.name} | "
          f"{cfg.rollout.batch_size} tasks x {cfg.rollout.n_samples_per_prompt} rollouts, max {cfg.env.max_steps} "
          f"steps, {int(n_steps)} steps | setup {build_s:.1f} s (not counted)")
    print(f"{'estimator':<10} {'generate_s':>10} {'env_s':>8} {'adv_s':>8} {'update_s':>9} {'steps/s':>8} {'adv_%':>9}")
    for name, g, e, a, u, sps, frac in rows:
        print(f"{name:<10} {g:>10.2f} {e:>8.2f} {a:>8.4f} {u:>9.2f} {sps:>8.3f} {frac:>8.4f}%")
    print("generate/env: one shared rollout; adv/update: per estimator on those episodes; target adv_% < 5")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
