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

import argparse
import asyncio
import dataclasses
import signal
import sys
import tempfile
import time

from progpo.run import flags
from progpo.run.flags import MISSING
from progpo.trainer.config import TrainConfig


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table (exit code 0)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks train", description=__doc__.split("\n")[0])
    from progpo.advantages import Estimator

    for option, dest, default, old in (
            ("--actor.model_name_or_path", "model", MISSING, ()), ("--env.name", "env", MISSING, ()),
            ("--rollout.batch_size", "tasks", 2, ("--tasks",)), ("--rollout.n_samples_per_prompt", "n", 4, ("--n",)),
            ("--env.max_steps", "max_steps", 5, ("--max_steps",)),
            ("--rollout.max_new_tokens", "max_new_tokens", 64, ("--max_new_tokens",)),
            ("--train.micro_batch_size", "micro_batch_size", 2, ("--micro_batch_size",))):
        flags.restate(p, TrainConfig, option, dest=dest, default=default, old=old)
    p.add_argument("--estimators", default=",".join(e.value for e in Estimator))
    args = p.parse_args(argv)

    from progpo.advantages import AdvantageConfig
    from progpo.run.process import setup_logging
    from progpo.trainer.config import config_from_args
    from progpo.run.env_setup import open_env_pool
    from progpo.trainer.loop import Trainer

    setup_logging("WARNING")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwind: stop the WebShop server
    names = [e.strip() for e in args.estimators.split(",") if e.strip()]
    with tempfile.TemporaryDirectory(prefix="progpo-bench-train-") as tmp:
        cfg = config_from_args([
            "--actor.model_name_or_path", args.model, "--env.name", args.env, "--ckpt.path", tmp,
            "--rollout.batch_size", str(args.tasks), "--rollout.n_samples_per_prompt", str(args.n),
            "--env.max_steps", str(args.max_steps), "--rollout.max_new_tokens", str(args.max_new_tokens),
            "--train.batch_size", "1000000", "--train.micro_batch_size", str(args.micro_batch_size),
            "--logger.progress_bar", "false", "--logger.tensorboard_dir", "none",
        ])
        trainer = Trainer(cfg)
        loop = asyncio.new_event_loop()
        rows = []
        with open_env_pool(cfg.env, args.tasks * args.n) as envs:
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
                                                  progpo=AdvantageConfig(estimator=name, max_steps=args.max_steps))
                t0 = time.perf_counter()
                samples, _ = trainer.advantages(roll.episodes)
                adv_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                trainer.update(samples)
                upd_s = time.perf_counter() - t0
                total = rollout_s + adv_s + upd_s
                rows.append((name, gen_s, env_s, adv_s, upd_s, n_steps / total, 100 * adv_s / total))
        loop.close()
    print(f"train iteration time split | model {args.model} | env {args.env} | {args.tasks} tasks x {args.n} "
          f"rollouts, max {args.max_steps} steps, {int(n_steps)} steps | setup {build_s:.1f} s (not counted)")
    print(f"{'estimator':<10} {'generate_s':>10} {'env_s':>8} {'adv_s':>8} {'update_s':>9} {'steps/s':>8} {'adv_%':>9}")
    for name, g, e, a, u, sps, frac in rows:
        print(f"{name:<10} {g:>10.2f} {e:>8.2f} {a:>8.4f} {u:>9.2f} {sps:>8.3f} {frac:>8.4f}%")
    print("generate/env: one shared rollout; adv/update: per estimator on those episodes; target adv_% < 5")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
