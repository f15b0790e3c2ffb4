"""``python -m progpo.cli.sft [FLAGS]``: behaviour-cloning warm start on expert trajectories.

1. plays ``--sft.num_tasks`` tasks of ``--env.train_split`` (seeded random order) with the env's
   expert (``progpo.agents.experts``: WebShop's scripted expert, ALFWorld's walkthroughs) through the
   RL episode loop, with the RL run's template, ``--env.history_length`` and context guard
   (``--rollout.max_prompt_tokens``): pass the values the later ``train`` run will use;
2. keeps the steps of the episodes the expert won, and trains the policy on them through DeepSpeed
   (token-mean NLL on response tokens only; ``progpo.trainer.sft``);
3. writes a checkpoint per epoch in the layout of ``train`` (``<save_path>/checkpoints/iter_N/hf`` is
   a Hugging Face folder), ``metrics.jsonl`` and ``sft_summary.json`` (expert success rate with a
   95% interval, samples, NLL per epoch). ``train --pretrain <save_path>`` starts RL from it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SUMMARY = "sft_summary.json"  # written last: a run folder without it is an SFT run cut short


def build_parser() -> argparse.ArgumentParser:
    """The sft CLI parser (flag names shared with ``progpo.cli.train`` where they mean the same)."""
    from progpo.trainer.config import ENV_DEFAULTS, _bool

    p = argparse.ArgumentParser(prog="python -m progpo.cli.sft", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--pretrain", default="smollm2-135m", help="HF model folder, run folder, or alias (smollm2-135m, tiny)")
    a("--save_path", default=None, help="output folder (default runs/sft_<env>)")
    a("--seed", type=int, default=42)
    a("--env.name", default="webshop", choices=sorted(ENV_DEFAULTS))
    a("--env.max_steps", type=int, default=None, help="default 15 (webshop) / 50 (alfworld)")
    a("--env.history_length", type=int, default=2)
    a("--env.data_dir", default=None)
    a("--env.webshop_url", default=None)
    a("--env.train_split", default="train")
    a("--rollout.max_prompt_tokens", type=int, default=2048, help="context guard limit (as in train)")
    a("--rollout.max_new_tokens", type=int, default=256, help="expert answers longer than this are dropped")
    a("--sft.num_tasks", type=int, default=64, help="expert episodes (tasks of the train split)")
    a("--sft.keep_failed", type=_bool, default=False, help="also train on episodes the expert lost")
    a("--train.max_epochs", type=int, default=2)
    a("--train.batch_size", type=int, default=8, help="samples per optimizer step")
    a("--train.micro_batch_size", type=int, default=2)
    a("--actor.adam.lr", type=float, default=1e-5)
    a("--actor.adam.weight_decay", type=float, default=0.0)
    a("--actor.max_norm", type=float, default=1.0)
    a("--ds.zero_stage", type=int, default=0)
    a("--ds.bf16", action="store_true")
    a("--ds.gradient_checkpointing", action="store_true")
    a("--ckpt.max_num", type=int, default=1)
    a("--log.progress_bar", type=_bool, default=True)
    return p


def _settings(ns: dict[str, Any]):
    from progpo.trainer.actor import ActorConfig
    from progpo.trainer.config import ENV_DEFAULTS, EnvSettings
    from progpo.trainer.sft import SFTConfig

    name = ns["env.name"]
    env = EnvSettings(name=name, max_steps=ns["env.max_steps"] or ENV_DEFAULTS[name]["max_steps"],
                      history_length=ns["env.history_length"], data_dir=ns["env.data_dir"],
                      webshop_url=ns["env.webshop_url"], train_split=ns["env.train_split"])
    actor = ActorConfig(pretrain=ns["pretrain"], lr=ns["actor.adam.lr"], weight_decay=ns["actor.adam.weight_decay"],
                        grad_clip=ns["actor.max_norm"], zero_stage=ns["ds.zero_stage"], bf16=ns["ds.bf16"],
                        micro_batch_size=ns["train.micro_batch_size"],
                        gradient_checkpointing=ns["ds.gradient_checkpointing"], use_ref=False)
    sft = SFTConfig(epochs=ns["train.max_epochs"], batch_size=ns["train.batch_size"], keep_failed=ns["sft.keep_failed"])
    for flag in ("sft.num_tasks", "rollout.max_prompt_tokens", "rollout.max_new_tokens", "ckpt.max_num"):
        if ns[flag] < 1:
            raise ValueError(f"--{flag} must be >= 1, got {ns[flag]}")
    return env, actor, sft


def _expert_factory(env, env_kwargs):
    """A zero-argument factory of the env's expert (``progpo.agents.experts``)."""
    from progpo.agents.experts import AlfWorldExpert, WebShopExpert, webshop_goals

    if env.name == "webshop":
        goals = webshop_goals(env_kwargs["base_url"])
        return lambda: WebShopExpert(goals)
    return AlfWorldExpert


def collect(env, tokenizer, *, num_tasks: int, seed: int, max_prompt_tokens: int, max_new_tokens: int,
            progress: bool = True):
    """Play ``num_tasks`` expert episodes (seeded random train tasks). Returns ``(episodes, tasks_in_split)``."""
    from tqdm.auto import tqdm

    from progpo.agents.episode import TaskSpec
    from progpo.agents.experts import expert_episodes
    from progpo.run.env_setup import open_env_pool
    from progpo.trainer.loop import TaskSampler

    with open_env_pool(env, max_envs=8) as handle:
        total = handle.num_tasks(env.train_split)
        ids = TaskSampler(total, seed).next(min(num_tasks, total))
        bar = tqdm(total=len(ids), desc="expert episodes", unit="ep", disable=not progress, file=sys.stderr)
        try:
            episodes = asyncio.run(expert_episodes(
                [TaskSpec(env.train_split, i) for i in ids], env_pool=handle.pool, tokenizer=tokenizer,
                env_name=env.name, make_expert=_expert_factory(env, handle.env_kwargs), max_steps=env.max_steps,
                history_length=env.history_length, max_prompt_tokens=max_prompt_tokens,
                max_new_tokens=max_new_tokens, on_episode_end=lambda ep: bar.update(1)))
        finally:
            bar.close()
    return episodes, total


def run(ns: dict[str, Any]) -> dict[str, Any]:
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

    env, actor_cfg, sft = _settings(ns)
    save = Path(ns["save_path"] or f"runs/sft_{env.name}")
    ckpt = CheckpointManager(save, ns["ckpt.max_num"])
    if ckpt.latest() is not None:
        raise ValueError(f"--save_path {save} already holds checkpoints; choose another --save_path")
    earlier = [n for n in ("metrics.jsonl", SUMMARY) if (save / n).exists()]
    if earlier:  # a run stopped before its first checkpoint: its records would be mixed with ours
        raise ValueError(f"--save_path {save} holds {' and '.join(earlier)} of an earlier run (no checkpoint); "
                         "choose another --save_path, or remove that folder")
    check_run_dir(save)  # before the model and the expert episodes, not after them
    actor_cfg = dataclasses.replace(actor_cfg, pretrain=resolve_pretrain(actor_cfg.pretrain))
    t0 = time.perf_counter()
    actor = Actor(actor_cfg)
    episodes, total = collect(env, actor.tokenizer, num_tasks=ns["sft.num_tasks"], seed=ns["seed"],
                              max_prompt_tokens=ns["rollout.max_prompt_tokens"],
                              max_new_tokens=ns["rollout.max_new_tokens"], progress=ns["log.progress_bar"])
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
    rng = np.random.default_rng(ns["seed"])
    summary: dict[str, Any] = {
        "env": env.name, "pretrain": actor_cfg.pretrain, "tasks_in_split": total, "expert_success": success,
        "expert_score_mean": float(np.mean([ep.info.get("score", float(ep.won)) for ep in done])) if done else None,
        "samples": len(samples), "response_tokens": sum(len(r) for _, r in samples),
        "prompt_tokens_mean": float(np.mean([len(p) for p, _ in samples])),
        "settings": {k: v for k, v in ns.items()}, "collect_s": t1 - t0, "epochs": [],
    }
    steps_per_epoch = -(-len(samples) // sft.batch_size)
    bar = tqdm(total=sft.epochs * steps_per_epoch, desc="sft", unit="step", disable=not ns["log.progress_bar"],
               file=sys.stderr)
    try:
        for epoch in range(1, sft.epochs + 1):
            e0 = time.perf_counter()
            m = sft_epoch(actor, samples, sft.batch_size, rng,
                          on_step=lambda loss: (bar.update(1), bar.set_postfix(nll=f"{loss:.3f}")))
            m["perf/epoch_s"] = time.perf_counter() - e0
            metrics.log(epoch, m)
            path = ckpt.save(actor, epoch, {"sft_epoch": epoch, "sft_epochs": sft.epochs, "seed": ns["seed"]}, rng)
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
    ns = vars(build_parser().parse_args(argv))
    try:
        with logging_redirect_tqdm():
            summary = run(ns)
    except (ValueError, FileNotFoundError, EnvFailure) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    save = ns["save_path"] or f"runs/sft_{ns['env.name']}"
    print(f"done: {summary['samples']} samples x {len(summary['epochs'])} epochs in {summary['total_s']:.0f} s; "
          f"RL from it: python -m progpo.cli.train --pretrain {save} ...", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
