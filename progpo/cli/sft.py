"""``python -m progpo.cli.sft [FLAGS]``: behaviour-cloning warm start on expert trajectories.

1. plays ``--sft.num_tasks`` tasks of ``--env.train_split`` (seeded random order; with ``--env.num_tasks``
   from the range ``--env.task_offset ..`` only, repeating it when ``--sft.num_tasks`` is larger) with the env's
   expert (``progpo.agents.experts``: WebShop's scripted expert, ALFWorld's walkthroughs) through the
   RL episode loop, with the RL run's template, ``--env.history_length`` and context guard
   (``--rollout.max_prompt_tokens``): pass the values the later ``train`` run will use;
2. keeps the steps of the episodes the expert won, and trains the policy on them through DeepSpeed
   (token-mean NLL on response tokens only; ``progpo.trainer.sft``);
3. writes a checkpoint per epoch in the layout of ``train`` (``<ckpt.path>/checkpoints/iter_N/hf`` is
   a Hugging Face folder), ``metrics.jsonl`` and ``sft_summary.json`` (expert success rate with a
   95% interval, samples, NLL per epoch). ``train --actor.model_name_or_path <ckpt.path>`` starts RL from it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from progpo.run import flags
from progpo.run.settings import EnvSettings, RolloutSettings
from progpo.trainer.config import DEPRECATED as TRAIN_DEPRECATED
from progpo.trainer.config import (ActorSettings, AdamSettings, CkptSettings, DeepSpeedSettings, LoggerSettings,
                                   TrainSettings)

logger = logging.getLogger(__name__)

SUMMARY = "sft_summary.json"  # written last: a run folder without it is an SFT run cut short


@dataclass(frozen=True)
class SFTSettings:
    """Behaviour cloning (``--sft.*``)."""

    num_tasks: int = 64
    """expert episodes (seeded random tasks of --env.train_split)"""
    keep_failed: bool = False
    """also train on the episodes the expert lost"""

    def __post_init__(self) -> None:
        if self.num_tasks < 1:
            raise ValueError(f"--sft.num_tasks must be >= 1, got {self.num_tasks}")


@dataclass(frozen=True)
class SFTArgs:
    """The flags of ``python -m progpo.cli.sft`` (names and meanings shared with ``train``)."""

    env: EnvSettings = field(default_factory=lambda: EnvSettings(pool="local"), metadata={
        "flags": ("name", "max_steps", "history_length", "invalid_penalty", "data_dir", "url", "train_split",
                  "num_tasks", "task_offset")})
    rollout: RolloutSettings = field(default_factory=lambda: RolloutSettings(max_prompt_tokens=2048),
                                     metadata={"flags": ("max_prompt_tokens", "max_new_tokens")})
    actor: ActorSettings = field(default_factory=lambda: ActorSettings(adam=AdamSettings(lr=1e-5)), metadata={
        "flags": ("model_name_or_path", "adam", "max_norm", "gradient_checkpointing_enable")})
    ds: DeepSpeedSettings = field(default_factory=DeepSpeedSettings)
    train: TrainSettings = field(default_factory=lambda: TrainSettings(max_epochs=2, batch_size=8, micro_batch_size=2),
                                 metadata={"flags": ("max_epochs", "batch_size", "micro_batch_size", "seed")})
    ckpt: CkptSettings = field(default_factory=lambda: CkptSettings(max_num=1), metadata={"flags": ("path", "max_num")})
    logger: LoggerSettings = field(default_factory=LoggerSettings, metadata={"flags": ("progress_bar",)})
    sft: SFTSettings = field(default_factory=SFTSettings)

    @property
    def save_path(self) -> Path:
        """The output folder (``--ckpt.path``, default ``runs/sft_<env>``)."""
        return Path(self.ckpt.path or f"runs/sft_{self.env.name}")


DEPRECATED = {k: v for k, v in TRAIN_DEPRECATED.items() if k not in ("--resume", "--rollout.invalid_penalty",
                                                                       "--algo.eps_clip_low_high", "--algo.entropy.coef",
                                                                       "--log.tensorboard")}


def build_parser() -> argparse.ArgumentParser:
    """The sft CLI parser (flag names shared with ``progpo.cli.train`` where they mean the same)."""
    p = argparse.ArgumentParser(prog="python -m progpo.cli.sft", description=__doc__.split("\n")[0])
    flags.add_flags(p, SFTArgs, deprecated=DEPRECATED)
    return p


def parse(argv: list[str] | None = None) -> SFTArgs:
    """Parse and check ``argv``; :class:`~progpo.run.flags.FlagError` (a ValueError) names a bad flag."""
    args = flags.build(SFTArgs, build_parser().parse_args(argv))
    return dataclasses.replace(args, env=args.env.resolved(pool="local"))


def _actor_config(args: SFTArgs):
    from progpo.trainer.actor import ActorConfig

    return ActorConfig(pretrain=args.actor.model_name_or_path, lr=args.actor.adam.lr,
                       weight_decay=args.actor.adam.weight_decay, betas=args.actor.adam.betas,
                       grad_clip=args.actor.max_norm, zero_stage=args.ds.zero_stage, bf16=args.ds.param_dtype == "bf16",
                       micro_batch_size=args.train.micro_batch_size,
                       gradient_checkpointing=args.actor.gradient_checkpointing_enable, use_ref=False)


def collect(env, tokenizer, *, num_tasks: int, seed: int, max_prompt_tokens: int, max_new_tokens: int,
            progress: bool = True):
    """Play ``num_tasks`` expert episodes: seeded random tasks of the train split, drawn from the range
    ``--env.task_offset .. + --env.num_tasks`` as ``train`` draws them (each task once per pass over the range).
    Returns ``(episodes, tasks_in_split)``."""
    from tqdm.auto import tqdm

    from progpo.agents.episode import TaskSpec
    from progpo.agents.experts import expert_episodes
    from progpo.run.env_setup import open_env_pool
    from progpo.trainer.loop import TaskSampler

    with open_env_pool(env, max_envs=8) as handle:
        total = handle.num_tasks(env.train_split)
        sampler = TaskSampler(total, seed, offset=env.task_offset, count=env.num_tasks)
        ids = sampler.next(min(num_tasks, total) if env.num_tasks is None else num_tasks)
        bar = tqdm(total=len(ids), desc="expert episodes", unit="ep", disable=not progress, file=sys.stderr)
        try:
            episodes = asyncio.run(expert_episodes(
                [TaskSpec(env.train_split, i) for i in ids], env_pool=handle.pool, tokenizer=tokenizer,
                env_name=env.name, make_expert=env.spec.load("expert")(handle.env_kwargs), max_steps=env.max_steps,
                history_length=env.history_length, max_prompt_tokens=max_prompt_tokens,
                invalid_penalty=env.invalid_penalty,
                max_new_tokens=max_new_tokens, on_episode_end=lambda ep: bar.update(1)))
        finally:
            bar.close()
    return episodes, total


def run(args: SFTArgs) -> dict[str, Any]:
    """Collect expert data, train, checkpoint; returns the summary (also written to sft_summary.json).

    Raises:
        ValueError: bad settings, or no expert episode was won (nothing to train on).
        FileNotFoundError: model or data missing.
    """
    import numpy as np
    from tqdm.auto import tqdm

    from progpo.trainer.actor import Actor
    from progpo.run.checkpoint import CheckpointManager, atomic_write_text, check_run_dir
    from progpo.run.evaluation import rate_interval
    from progpo.run.metrics import MetricsLogger
    from progpo.run.models import resolve_pretrain
    from progpo.trainer.sft import expert_samples, mean_nll, sft_epoch

    from progpo.trainer.sft import SFTConfig

    env = args.env
    if env.spec.expert is None:
        raise ValueError(f"--env.name {env.name} has no expert to clone (its env spec names none)")
    actor_cfg = _actor_config(args)
    sft = SFTConfig(epochs=args.train.max_epochs, batch_size=args.train.batch_size, keep_failed=args.sft.keep_failed)
    save = args.save_path
    ckpt = CheckpointManager(save, args.ckpt.max_num)
    if ckpt.latest() is not None:
        raise ValueError(f"--ckpt.path {save} already holds checkpoints; choose another --ckpt.path")
    earlier = [n for n in ("metrics.jsonl", SUMMARY) if (save / n).exists()]
    if earlier:  # a run stopped before its first checkpoint: its records would be mixed with ours
        raise ValueError(f"--ckpt.path {save} holds {' and '.join(earlier)} of an earlier run (no checkpoint); "
                         "choose another --ckpt.path, or remove that folder")
    check_run_dir(save)  # before the model and the expert episodes, not after them
    actor_cfg = dataclasses.replace(actor_cfg, pretrain=resolve_pretrain(actor_cfg.pretrain))
    t0 = time.perf_counter()
    actor = Actor(actor_cfg)
    episodes, total = collect(env, actor.tokenizer, num_tasks=args.sft.num_tasks, seed=args.train.seed,
                              max_prompt_tokens=args.rollout.max_prompt_tokens,
                              max_new_tokens=args.rollout.max_new_tokens, progress=args.logger.progress_bar)
    t1 = time.perf_counter()
    done = [ep for ep in episodes if not ep.failed]
    success = rate_interval(sum(ep.won for ep in done), len(done))
    samples = expert_samples(episodes, keep_failed=sft.keep_failed)
    print(f"expert: won {success['wins']}/{success['n']} episodes ({success['rate']:.3f}, 95% "
          f"{success['low']:.3f}-{success['high']:.3f}); {len(samples)} step samples, "
          f"{sum(len(r) for _, r in samples)} response tokens ({t1 - t0:.0f} s)", flush=True)
    if not samples:
        raise ValueError("no expert step to train on (the expert won no episode); try more --sft.num_tasks")
    metrics = MetricsLogger(save, tensorboard=False)
    rng = np.random.default_rng(args.train.seed)
    summary: dict[str, Any] = {
        "env": env.name, "pretrain": actor_cfg.pretrain, "tasks_in_split": total, "expert_success": success,
        "expert_score_mean": float(np.mean([ep.info.get("score", float(ep.won)) for ep in done])) if done else None,
        "samples": len(samples), "response_tokens": sum(len(r) for _, r in samples),
        "prompt_tokens_mean": float(np.mean([len(p) for p, _ in samples])),
        "settings": dataclasses.asdict(args), "collect_s": t1 - t0, "epochs": [],
    }
    steps_per_epoch = -(-len(samples) // sft.batch_size)
    bar = tqdm(total=sft.epochs * steps_per_epoch, desc="sft", unit="step", disable=not args.logger.progress_bar,
               file=sys.stderr)
    try:
        for epoch in range(1, sft.epochs + 1):
            e0 = time.perf_counter()
            m = sft_epoch(actor, samples, sft.batch_size, rng,
                          on_step=lambda loss: (bar.update(1), bar.set_postfix(nll=f"{loss:.3f}")))
            m["perf/epoch_s"] = time.perf_counter() - e0
            metrics.log(epoch, m)
            path = ckpt.save(actor, epoch, {"sft_epoch": epoch, "sft_epochs": sft.epochs, "seed": args.train.seed}, rng)
            summary["epochs"].append({"epoch": epoch, **m, "checkpoint": str(path)})
            bar.write(f"epoch {epoch}: nll={m['loss/sft_nll']:.4f} steps={int(m['loss/optimizer_steps'])} "
                      f"time={m['perf/epoch_s']:.0f}s checkpoint={path}", file=sys.stdout)
    finally:
        bar.close()
        metrics.close()
    summary["final_nll"] = mean_nll(actor, samples[: min(len(samples), 64)])
    summary["total_s"] = time.perf_counter() - t0
    atomic_write_text(save / SUMMARY, json.dumps(summary, indent=2, default=str))  # marks the run finished
    return summary


def main(argv: list[str] | None = None) -> int:
    """Parse flags and run; exit code 2 on bad flags or missing data/model."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    from progpo.run.process import prepare_process
    from progpo.envs.base import EnvFailure

    prepare_process()
    try:
        args = parse(argv)
        with logging_redirect_tqdm():
            summary = run(args)
    except (ValueError, FileNotFoundError, EnvFailure) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    print(f"done: {summary['samples']} samples x {len(summary['epochs'])} epochs in {summary['total_s']:.0f} s; "
          f"RL from it: python -m progpo.cli.train --actor.model_name_or_path {args.save_path} ...", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
