"""Behaviour cloning (SFT) on expert trajectories, and the cached warm start of ``train``.

:func:`run_sft` is ``python -m progpo.cli.sft``: it plays expert episodes through the RL episode loop
(the RL run's template, history window and context guard, so each cloned prompt is exactly the prompt
RL shows at that state), trains the policy on the steps of the won episodes (token-mean NLL on response
tokens, :mod:`progpo.trainer.sft`) and writes ``train``'s layout: ``checkpoints/iter_<epoch>/hf``,
``metrics.jsonl`` and, last, ``sft_summary.json``.

:func:`warm_start` is ``train --sft.num_tasks N``: the same SFT, run with the train run's own env
and rollout settings (so the protocols cannot differ), into a cache folder named by a hash of
everything that shapes the cloned model (:func:`cache_key`: the SFT settings, the base model's files,
the data folder and the source of the code that builds the samples). A later run with the same key
reuses it; any changed setting gives another key, so a stale model is never reused. The folder is
written under a temporary name and renamed into place only when finished, so it is never half-written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from progpo.envs import spec
from progpo.run.metrics import MetricsLogger
from progpo.run.precision import resolve_precision
from progpo.run.settings import EnvSettings, RolloutSettings, TrainSettings
from progpo.run.task_sampler import TaskSampler
from progpo.trainer.actor import Actor, ActorConfig
from progpo.trainer.config import CkptSettings, LoggerSettings, SFTSettings
from progpo.trainer.settings import ActorSettings, AdamSettings, DeepSpeedSettings
from progpo.trainer.sft import sft_epoch

logger = logging.getLogger(__name__)

SUMMARY = "sft_summary.json"  # written last: a run folder without it is an SFT run cut short
KEY_FILE = "warm_start_key.json"
WARM_START_DIR = Path.home() / ".cache" / "progpo" / "warm_start"
"""Default root of the cached warm starts (``--sft.cache_dir``)."""

#: source files whose code shapes the cloned samples or their training (part of the cache key), with the
#: env's own modules named by its spec (:data:`KEY_SPEC_FIELDS`).
KEY_SOURCES = ("agents/templates.py", "agents/experts.py", "agents/episode.py", "agents/parsing.py",
               "trainer/sft.py", "trainer/warm_start.py", "trainer/actor.py", "run/precision.py")
KEY_SPEC_FIELDS = ("template", "syntax", "expert")
"""Spec fields whose modules shape the cloned samples: the env's prompt template, action-syntax check and expert."""


def _env_sources(env_name: str) -> dict[str, str]:
    """sha256 of the source file of each module the env's spec names in :data:`KEY_SPEC_FIELDS`, by module name."""
    env_spec = spec(env_name)
    modules = {ref.split(":")[0] for ref in (getattr(env_spec, f) for f in KEY_SPEC_FIELDS) if ref is not None}
    return {m: hashlib.sha256(Path(importlib.util.find_spec(m).origin).read_bytes()).hexdigest() for m in sorted(modules)}


@dataclass(frozen=True)
class SFTArgs:
    """The flags of ``python -m progpo.cli.sft`` (names and meanings shared with ``train``)."""

    env: EnvSettings = field(default_factory=lambda: EnvSettings(pool="local"), metadata={
        "flags": ("name", "max_steps", "history_length", "invalid_penalty", "data_dir", "url", "train_split",
                  "num_tasks", "task_offset")})
    rollout: RolloutSettings = field(default_factory=lambda: RolloutSettings(max_prompt_tokens=2048),
                                     metadata={"flags": ("max_prompt_tokens", "max_new_tokens")})
    actor: ActorSettings = field(default_factory=ActorSettings, metadata={
        "flags": ("model_name_or_path", "adam", "max_norm", "gradient_checkpointing_enable"), "skip": ("adam.lr",)})
    ds: DeepSpeedSettings = field(default_factory=DeepSpeedSettings)
    train: TrainSettings = field(default_factory=lambda: TrainSettings(micro_batch_size=2),
                                 metadata={"flags": ("micro_batch_size", "seed")})
    ckpt: CkptSettings = field(default_factory=lambda: CkptSettings(max_num=1), metadata={"flags": ("path", "max_num")})
    logger: LoggerSettings = field(default_factory=LoggerSettings, metadata={"flags": ("progress_bar",)})
    sft: SFTSettings = field(default_factory=SFTSettings, metadata={"skip": ("cache_dir", "lora")})
    """the behaviour cloning itself: the same --sft.* flags and defaults as train's warm start (but --sft.lora, which
    only says how train's warm start clones: here --ds.lora.rank > 0 alone clones into an adapter)"""

    def __post_init__(self) -> None:
        if self.sft.num_tasks < 1:
            raise ValueError(f"--sft.num_tasks must be >= 1, got {self.sft.num_tasks}")

    @property
    def save_path(self) -> Path:
        """The output folder (``--ckpt.path``, default ``runs/sft_<env>``)."""
        return Path(self.ckpt.path or f"runs/sft_{self.env.name}")


def _actor_config(args: SFTArgs, pretrain: str) -> ActorConfig:
    """The actor of the behaviour cloning: the run's ``--actor.*``, ``--ds.*`` and ``--train.*`` settings with the
    model folder ``pretrain`` and ``--sft.lr`` as AdamW's learning rate, without a reference model."""
    adam = dataclasses.replace(args.actor.adam, lr=args.sft.lr)
    actor = dataclasses.replace(args.actor, model_name_or_path=pretrain, adam=adam)
    return ActorConfig(actor=actor, ds=args.ds, train=args.train, use_ref=False)


def collect(env: EnvSettings, rollout: RolloutSettings, tokenizer, handle, *, num_tasks: int, seed: int,
            progress: bool = True):
    """Play ``num_tasks`` expert episodes on the open env ``handle`` with the ``--env.*`` (resolved) and
    ``--rollout.*`` settings (context guard, response limit): seeded random tasks of the train split,
    drawn from the range ``--env.task_offset .. + --env.num_tasks`` as ``train`` draws them (each task once
    per pass over the range; the whole split when ``--env.num_tasks`` is unset).

    Returns:
        ``(episodes, tasks_in_split)``.
    """
    from tqdm.auto import tqdm

    from progpo.agents.episode import TaskSpec
    from progpo.agents.experts import expert_episodes
    total = handle.num_tasks(env.train_split)
    sampler = TaskSampler(total, seed, offset=env.task_offset, count=env.num_tasks)
    ids = sampler.next(min(num_tasks, total) if env.num_tasks is None else num_tasks)
    bar = tqdm(total=len(ids), desc="expert episodes", unit="ep", disable=not progress, file=sys.stderr)
    try:
        episodes = asyncio.run(expert_episodes(
            [TaskSpec(env.train_split, i) for i in ids], env_pool=handle.pool, tokenizer=tokenizer, env=env,
            rollout=rollout, make_expert=env.spec.load("expert")(handle.env_kwargs),
            on_episode_end=lambda ep: bar.update(1)))
    finally:
        bar.close()
    return episodes, total


def check_sft_dir(save: Path) -> None:
    """Refuse an ``--ckpt.path`` that holds an earlier run, before any costly work.

    Raises:
        ValueError: checkpoints, ``metrics.jsonl`` or ``sft_summary.json`` are there, or the path is not writable.
    """
    from progpo.run.checkpoint import CheckpointManager, check_run_dir

    if CheckpointManager(save).latest() is not None:
        raise ValueError(f"--ckpt.path {save} already holds checkpoints; choose another --ckpt.path")
    earlier = [n for n in ("metrics.jsonl", SUMMARY) if (save / n).exists()]
    if earlier:  # a run stopped before its first checkpoint: its records would be mixed with ours
        raise ValueError(f"--ckpt.path {save} holds {' and '.join(earlier)} of an earlier run (no checkpoint); "
                         "choose another --ckpt.path, or remove that folder")
    check_run_dir(save)


def run_sft(args: SFTArgs, save: Path | None = None, handle=None, out=None) -> dict[str, Any]:
    """Collect expert data, train, checkpoint into ``save`` (default ``args.save_path``); returns the summary
    (also written to ``sft_summary.json``, last).

    Args:
        args: the SFT settings. save: the output folder (checked by :func:`check_sft_dir`).
        handle: an open env (``progpo.run.env_setup.open_env_pool``) to play the expert on; None opens one.
        out: where the progress lines go (expert success, one line per epoch; None: stdout).

    Raises:
        ValueError: bad settings, or no expert episode was won (nothing to train on).
        FileNotFoundError: model or data missing.
    """
    import contextlib

    from progpo.run.checkpoint import CheckpointManager, atomic_write_text
    from progpo.run.env_setup import open_env_pool
    from progpo.run.evaluation import rate_interval
    from progpo.run.models import resolve_pretrain
    from progpo.trainer.sft import expert_samples, mean_nll

    out = sys.stdout if out is None else out
    env = args.env
    if env.spec.expert is None:
        raise ValueError(f"--env.name {env.name} has no expert to clone (its env spec names none)")
    sft = args.sft
    save = Path(save) if save is not None else args.save_path
    ckpt = CheckpointManager(save, args.ckpt.max_num, lr_flag="--sft.lr")
    check_sft_dir(save)  # before the model and the expert episodes, not after them
    actor_cfg = _actor_config(args, resolve_pretrain(args.actor.model_name_or_path))
    t0 = time.perf_counter()
    actor = Actor(actor_cfg)
    with (open_env_pool(env, max_envs=8) if handle is None else contextlib.nullcontext(handle)) as envs:
        episodes, total = collect(env, args.rollout, actor.tokenizer, envs, num_tasks=args.sft.num_tasks,
                                  seed=args.train.seed, progress=args.logger.progress_bar)
    t1 = time.perf_counter()
    done = [ep for ep in episodes if not ep.failed]
    success = rate_interval(sum(ep.won for ep in done), len(done))
    samples = expert_samples(episodes, keep_failed=sft.keep_failed)
    print(f"expert: won {success['wins']}/{success['n']} episodes ({success['rate']:.3f}, 95% "
          f"{success['low']:.3f}-{success['high']:.3f}); {len(samples)} step samples, "
          f"{sum(len(r) for _, r in samples)} response tokens ({t1 - t0:.0f} s)", file=out, flush=True)
    if not samples:
        raise ValueError("no expert step to train on (the expert won no episode); try more --sft.num_tasks")
    summary: dict[str, Any] = {
        "env": env.name, "pretrain": actor_cfg.actor.model_name_or_path, "tasks_in_split": total, "expert_success": success,
        "expert_score_mean": float(np.mean([ep.info.get("score", float(ep.won)) for ep in done])) if done else None,
        "samples": len(samples), "response_tokens": sum(len(r) for _, r in samples),
        "prompt_tokens_mean": float(np.mean([len(p) for p, _ in samples])),
        "settings": dataclasses.asdict(args), "collect_s": t1 - t0,
        "epochs": _train_epochs(actor, samples, sft, args, ckpt, save, out),
    }
    summary["final_nll"] = mean_nll(actor, samples[: min(len(samples), 64)])
    summary["total_s"] = time.perf_counter() - t0
    atomic_write_text(save / SUMMARY, json.dumps(summary, indent=2, default=str))  # marks the run finished
    return summary


def _train_epochs(actor, samples, sft, args: SFTArgs, ckpt, save: Path, out) -> list[dict[str, Any]]:
    """``sft.max_epochs`` passes of behaviour cloning over ``samples`` (token-mean NLL, :func:`progpo.trainer.sft.sft_epoch`),
    a checkpoint and a ``metrics.jsonl`` record after each; returns one summary row per epoch."""
    metrics = MetricsLogger(save, tensorboard=False)
    rng = np.random.default_rng(args.train.seed)
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=sft.max_epochs * -(-len(samples) // sft.batch_size), desc="sft", unit="step",
               disable=not args.logger.progress_bar, file=sys.stderr)
    try:
        for epoch in range(1, sft.max_epochs + 1):
            e0 = time.perf_counter()
            m = sft_epoch(actor, samples, sft.batch_size, rng,
                          on_step=lambda loss: (bar.update(1), bar.set_postfix(nll=f"{loss:.3f}")))
            m["perf/epoch_s"] = time.perf_counter() - e0
            metrics.log(epoch, m)
            path = ckpt.save(actor, epoch, {"sft_epoch": epoch, "sft_epochs": sft.max_epochs, "seed": args.train.seed}, rng)
            rows.append({"epoch": epoch, **m, "checkpoint": str(path)})
            bar.write(f"epoch {epoch}: nll={m['loss/sft_nll']:.4f} steps={int(m['loss/optimizer_steps'])} "
                      f"time={m['perf/epoch_s']:.0f}s checkpoint={path}", file=out)
    finally:
        bar.close()
        metrics.close()
    return rows


# ---- the cached warm start of train -----------------------------------------------------------------
def sft_args(cfg) -> SFTArgs:
    """The SFT settings of a train run's warm start (``TrainConfig`` ``cfg``): its env, context guard,
    response limit, base model, DeepSpeed stage and dtype, seed and micro-batch, and ``--sft.*``.
    Behaviour cloning trains every weight (a LoRA adapter of the RL run goes on top of the cloned model), or with
    ``--sft.lora true`` the RL run's LoRA adapter (``--ds.lora.*``), which RL then goes on training
    (:func:`adapter_dir`)."""
    return SFTArgs(
        env=cfg.env,
        rollout=dataclasses.replace(RolloutSettings(), max_prompt_tokens=cfg.rollout.max_prompt_tokens,
                                    max_new_tokens=cfg.rollout.max_new_tokens),
        actor=ActorSettings(model_name_or_path=cfg.actor.model_name_or_path, adam=AdamSettings(),
                            max_norm=cfg.actor.max_norm,
                            gradient_checkpointing_enable=cfg.actor.gradient_checkpointing_enable),
        ds=cfg.ds if cfg.sft.lora else dataclasses.replace(cfg.ds, lora=type(cfg.ds.lora)()),
        train=TrainSettings(micro_batch_size=cfg.train.micro_batch_size, seed=cfg.train.seed),
        ckpt=CkptSettings(max_num=1),
        logger=LoggerSettings(tensorboard_dir=None, progress_bar=cfg.logger.progress_bar),
        sft=dataclasses.replace(cfg.sft, cache_dir=None),  # where it is cached is not part of what it is
    )


def adapter_dir(run: str | Path) -> str:
    """The LoRA adapter folder of a finished warm start cloned with ``--sft.lora true`` (its newest checkpoint's
    ``adapter/``).

    Raises:
        FileNotFoundError: no complete checkpoint in ``run``, or that checkpoint holds no adapter (a clone of
            every weight).
    """
    from progpo.run.checkpoint import CheckpointManager
    from progpo.run.lora import ADAPTER_DIR

    latest = CheckpointManager(Path(run)).latest()
    if latest is None or not (latest / ADAPTER_DIR / "adapter_config.json").is_file():
        raise FileNotFoundError(f"warm start {run}: no checkpoint with a LoRA adapter (cloned without --sft.lora?)")
    return str(latest / ADAPTER_DIR)


def _files_digest(folder: Path) -> list[tuple[str, int, str]]:
    """``(name, bytes, sha256)`` of every file in ``folder`` (sorted; the model's weights, config, tokenizer)."""
    out = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with path.open("rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        out.append((str(path.relative_to(folder)), path.stat().st_size, digest))
    return out


def cache_key(args: SFTArgs, base_model_dir: str, data_identity: dict[str, Any]) -> dict[str, Any]:
    """What the cloned model depends on, as a JSON-ready dict (its sha256 names the cache folder).

    ``settings``: every SFT setting but the output folder and logging; ``precision``: what
    ``--ds.mixed_precision`` resolves to on this machine (``bf16`` clones another model than fp32);
    ``base_model``: name, size and sha256 of each file of
    the resolved base model folder; ``data``: the env's data folder and split size; ``code``: sha256 of
    the source files that build and train on the samples (:data:`KEY_SOURCES`, and the env's own modules that
    hold its template, syntax check and expert).
    """
    settings = dataclasses.asdict(dataclasses.replace(args, ckpt=CkptSettings(max_num=1), logger=LoggerSettings()))
    settings["env"].pop("url", None)  # where a server runs, not what it serves (the data says that)
    root = Path(__file__).resolve().parent.parent
    code = {src: hashlib.sha256((root / src).read_bytes()).hexdigest() for src in KEY_SOURCES}
    code.update(_env_sources(args.env.name))
    precision = resolve_precision(args.ds.mixed_precision, param_dtype=args.ds.param_dtype,
                                  device_type="cuda" if torch.cuda.is_available() else "cpu").name
    return {"settings": settings, "precision": precision, "base_model": _files_digest(Path(base_model_dir)),
            "data": data_identity, "code": code}


def _key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def warm_start(cfg, handle, out=None) -> Path:
    """The behaviour-cloned model folder of train config ``cfg``: from the cache, or trained now.

    Args:
        cfg: the ``TrainConfig`` (``cfg.sft.num_tasks >= 1``). handle: the run's open env.
        out: where progress lines go (None: stdout).

    Returns:
        The cache folder (a finished ``sft`` run folder: ``train --actor.model_name_or_path`` takes it).

    Raises:
        ValueError / FileNotFoundError: as :func:`run_sft`.
    """
    from progpo.run.checkpoint import atomic_write_text
    from progpo.run.models import resolve_pretrain

    out = sys.stdout if out is None else out
    args = sft_args(cfg)
    base = resolve_pretrain(cfg.actor.model_name_or_path)
    from progpo.paths import data_root

    data = {"env": cfg.env.name, "data_dir": str(data_root(cfg.env.data_dir).resolve()),
            "train_split": cfg.env.train_split, "tasks_in_split": handle.num_tasks(cfg.env.train_split)}
    key = cache_key(args, base, data)
    digest = _key_digest(key)
    root = Path(cfg.sft.cache_dir).expanduser() if cfg.sft.cache_dir else WARM_START_DIR
    final = root / f"{cfg.env.name}-{digest[:16]}"
    if (final / SUMMARY).is_file():
        print(f"warm start: reusing the behaviour-cloned model in {final}", file=out, flush=True)
        return final
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".tmp-{final.name}-*"):  # runs that died on the way: never used, removed
        pid = stale.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not _pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"warm start: behaviour cloning on {cfg.sft.num_tasks} expert episodes ({cfg.sft.max_epochs} "
          f"epochs, lr {cfg.sft.lr:g}) into {final} (cached for later runs with the same settings)",
          file=out, flush=True)
    try:
        summary = run_sft(args, save=tmp, handle=handle, out=out)
        atomic_write_text(tmp / KEY_FILE, json.dumps({"sha256": digest, **key}, indent=2, default=str))
        _repoint(tmp, final)
        try:
            os.replace(tmp, final)
        except OSError:  # another run finished the same warm start first: use it
            if not (final / SUMMARY).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        gc.collect()  # the SFT actor's weights and optimizer state, before the RL actor is built
    print(f"warm start: expert won {summary['expert_success']['wins']}/{summary['expert_success']['n']}, "
          f"{summary['samples']} samples, final NLL {summary['final_nll']:.3f} ({summary['total_s']:.0f} s)",
          file=out, flush=True)
    return final


def _repoint(tmp: Path, final: Path) -> None:
    """Checkpoint paths inside the summary name ``tmp``; after the rename they live under ``final``."""
    path = tmp / SUMMARY
    text = path.read_text().replace(str(tmp), str(final))
    from progpo.run.checkpoint import atomic_write_text

    atomic_write_text(path, text)
