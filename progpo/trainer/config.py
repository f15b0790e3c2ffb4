"""Run configuration of the local backend: one frozen dataclass tree, and the flags that build it.

:class:`TrainConfig` is both the command line of ``python -m progpo.cli.train`` and what the trainer
reads: the flag ``--actor.adam.lr`` is the field ``cfg.actor.adam.lr`` (:mod:`progpo.run.flags`
generates the flags from the fields and their attribute docstrings; the dataclasses are the only
source of defaults). Flag names are OpenRLHF 0.11.2's where OpenRLHF has the setting (``--actor.*``,
``--ds.*``, ``--algo.advantage.estimator``, ``--algo.kl.*``, ``--train.*``, ``--ckpt.*``, ``--rollout.*``), and the
shared ``--env.*`` / ``--rollout.*`` settings of :mod:`progpo.run.settings` are the same classes on
``train_ray``; ``--progpo.<field>`` is every field of ``progpo.advantages.AdvantageConfig``.
Every validation error is a :class:`~progpo.run.flags.FlagError` naming the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from progpo.advantages import AdvantageConfig
from progpo.bounds import check_fields, number
from progpo.run import flags
from progpo.run.settings import (EnvSettings, RolloutSettings, TrainSettings, add_advantage_flags, advantage_config,
                                 check_group_size, max_optimizer_steps)
from progpo.trainer.actor import ActorConfig
from progpo.trainer.settings import ActorSettings, AlgoSettings, DeepSpeedSettings
from progpo.trainer.update import UpdateConfig

@dataclass(frozen=True)
class CkptSettings:
    """Run folder and checkpoints (``--ckpt.*``)."""

    path: str | None = None
    """run folder: checkpoints, metrics.jsonl, tensorboard/ (None: runs/<env>_<estimator>)"""
    load_enable: bool = False
    """continue from the latest checkpoint in --ckpt.path"""
    save_steps: int = 1
    """checkpoint every this many iterations (the last one always)"""
    max_num: int = 2
    """checkpoints kept"""

    def __post_init__(self) -> None:
        for name in ("save_steps", "max_num"):
            if getattr(self, name) < 1:
                raise ValueError(f"--ckpt.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class LoggerSettings:
    """Logging (``--logger.*``)."""

    tensorboard_dir: str | None = "tensorboard"
    """folder of the TensorBoard events (OpenRLHF's flag); a relative one is inside --ckpt.path (none: no events)"""
    progress_bar: bool = True
    """show a progress bar of each iteration's stages"""


@dataclass(frozen=True)
class SFTSettings:
    """Behaviour cloning on expert trajectories (``--sft.*``): the ``sft`` command and ``train``'s warm start
    before RL take these same flags, meanings and defaults (:mod:`progpo.trainer.warm_start`).

    Only ``num_tasks`` differs by design: ``train`` defaults to 0 (no warm start), ``sft`` to 64.

    Why the learning rate's default is 5e-5: it is the rate measured on this project's main job
    (SmolLM2-135M-Instruct, 8 expert episodes, 2 epochs, batch 8, i.e. about 10 optimizer steps), where
    these few steps teach the base model the answer format it never writes by itself (the NLL and the
    valid-format shares: docs/training.md, "The main job" and "A CPU run that learns"). A warm start is
    only useful if they do; 1e-5 (the ``sft`` command's former default) has no such measurement and moves
    the weights 5x less per step.
    """

    num_tasks: int = 64
    """expert episodes to clone (seeded random tasks of --env.train_split; train: 0 = no warm start, the default). train uses the run's own env and rollout settings and caches the cloned model under --sft.cache_dir, keyed by everything that shapes it"""
    max_epochs: int = 2
    """passes over the expert steps"""
    lr: float = number(5e-5, "> 0")
    """AdamW learning rate of the behaviour cloning"""
    batch_size: int = 8
    """expert steps per optimizer step (micro-batches of --train.micro_batch_size)"""
    keep_failed: bool = False
    """also clone the episodes the expert did not win (e.g. walkthroughs cut by a short --env.max_steps)"""
    cache_dir: str | None = None
    """train: where cloned models are kept (None: ~/.cache/progpo/warm_start)"""
    lora: bool = False
    """train: clone into the LoRA adapter of --ds.lora.* (rank > 0) on the frozen base instead of into every weight, and RL goes on training that same adapter, so the base weights never change: bf16 compute (--ds.mixed_precision bf16) rounds each base weight, which the clone and RL never move, and the adapter's B, which starts at zero, at its own scale, where a full clone's small steps on every weight are rounded away (docs/training.md, "LoRA"). Without it the warm start clones every weight and a fresh adapter goes on top"""

    def __post_init__(self) -> None:
        if self.num_tasks < 0:
            raise ValueError(f"--sft.num_tasks must be >= 0, got {self.num_tasks}")
        for name in ("max_epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--sft.{name} must be >= 1, got {getattr(self, name)}")
        check_fields(self, lambda name: f"--sft.{name}")


def check_sft_lora(sft: SFTSettings, ds: DeepSpeedSettings) -> None:
    """``--sft.lora true`` clones into the adapter of ``--ds.lora.*``, so it needs one, and a warm start.

    Raises:
        ValueError: ``--sft.lora true`` with ``--ds.lora.rank 0`` or ``--sft.num_tasks 0`` (the flags named).
    """
    if sft.lora and sft.num_tasks < 1:
        raise ValueError("--sft.lora true sets how the warm start clones, but --sft.num_tasks is 0 (no warm start): "
                         "give --sft.num_tasks >= 1, or drop --sft.lora")
    if sft.lora and ds.lora.rank < 1:
        raise ValueError("--sft.lora true clones into the LoRA adapter of --ds.lora.*, but --ds.lora.rank is "
                         f"{ds.lora.rank}: give --ds.lora.rank >= 1 (e.g. 16), or drop --sft.lora")


def _train_rollout() -> RolloutSettings:
    return RolloutSettings(max_prompt_tokens=2048)


@dataclass(frozen=True)
class TrainConfig:
    """Everything one local run needs (``python -m progpo.cli.train``); never mutated at run time."""

    env: EnvSettings = field(default_factory=lambda: EnvSettings(pool="local"), metadata={"skip": ("split_size", "task_dir")})
    rollout: RolloutSettings = field(default_factory=_train_rollout)
    actor: ActorSettings = field(default_factory=ActorSettings)
    ds: DeepSpeedSettings = field(default_factory=DeepSpeedSettings)
    algo: AlgoSettings = field(default_factory=AlgoSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    ckpt: CkptSettings = field(default_factory=CkptSettings)
    logger: LoggerSettings = field(default_factory=LoggerSettings)
    sft: SFTSettings = field(default_factory=lambda: SFTSettings(num_tasks=0))
    progpo: AdvantageConfig | None = field(default=None, metadata={"flag": False})
    """the estimator's settings, built from --algo.advantage.estimator, --progpo.preset and --progpo.<field> (None: the estimator's defaults with the env's step limit)"""

    def __post_init__(self) -> None:
        estimator = self.algo.advantage.estimator
        check_group_size(estimator, self.rollout.n_samples_per_prompt)
        if self.env.pool == "http":
            raise ValueError("--env.pool http serves the engines' event loops on train_ray; use local or ray on train")
        if self.progpo is None:
            max_steps = self.env.max_steps or self.env.spec.max_steps
            object.__setattr__(self, "progpo", AdvantageConfig(estimator=estimator, max_steps=max_steps))
        elif self.progpo.estimator != estimator:
            raise ValueError(f"--algo.advantage.estimator is {estimator} but the estimator settings are "
                             f"for {self.progpo.estimator}")
        check_sft_lora(self.sft, self.ds)
        # their checks name the flags, now rather than at the first update; they do not depend on the schedule's
        # length, and a run whose length is one pass over tasks not yet counted has at least one iteration
        self.actor_config(self.train.num_iterations or 1), self.update_config()

    @property
    def save_path(self) -> str:
        """The run folder (``--ckpt.path``, default ``runs/<env>_<estimator>``)."""
        return self.ckpt.path or f"runs/{self.env.name}_{self.algo.advantage.estimator}"

    def actor_config(self, num_iterations: int) -> ActorConfig:
        """The actor's runtime settings (``progpo.trainer.actor``): ``--actor.*``, ``--ds.*`` and ``--train.*``,
        a reference model when the KL term is on, and the schedule's length (:meth:`max_optimizer_steps`) for a
        run of ``num_iterations`` iterations (:meth:`TrainSettings.iterations`)."""
        return ActorConfig(actor=self.actor, ds=self.ds, train=self.train, use_ref=self.algo.kl.init_coef > 0,
                           scheduler_steps=self.max_optimizer_steps(num_iterations))

    def max_optimizer_steps(self, num_iterations: int) -> int:
        """The most optimizer steps a run of ``num_iterations`` iterations can take: the length of the lr schedule
        (``progpo.run.settings.max_optimizer_steps``, which ``train_ray``'s trainer uses too)."""
        return max_optimizer_steps(num_iterations, self.train.max_epochs, self.rollout.batch_size,
                                   self.rollout.n_samples_per_prompt, self.env.max_steps or self.env.spec.max_steps,
                                   self.train.batch_size)

    def update_config(self) -> UpdateConfig:
        """The PPO update's runtime settings (``progpo.trainer.update``)."""
        return UpdateConfig(train=self.train, actor=self.actor, kl=self.algo.kl, rollout=self.rollout)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict (written to ``<ckpt.path>/config.json``)."""
        return dataclasses.asdict(self)


# ---- the train CLI ----------------------------------------------------------------------------
def build_parser(prog: str = "python -m progpo.cli.train") -> argparse.ArgumentParser:
    """The ``train`` parser: every leaf of :class:`TrainConfig` as a flag, plus the estimator's."""
    p = argparse.ArgumentParser(prog=prog, description="Train an LLM agent with step-level group RL "
                                "(ProGPO, GiGPO, GRPO, ...) on the local backend.", allow_abbrev=False)
    flags.add_flags(p, TrainConfig)
    add_advantage_flags(p)
    return p


def config_from_args(argv: list[str] | None = None) -> TrainConfig:
    """Parse ``argv`` into a validated ``TrainConfig``.

    Raises:
        FlagError: an invalid value (a ``ValueError`` whose message starts with the flag).
        SystemExit: argparse errors (unknown flag, wrong type) as usual.
    """
    ns = build_parser().parse_args(argv)
    return config_from_namespace(ns)


def config_from_namespace(ns: argparse.Namespace) -> TrainConfig:
    """:func:`config_from_args` after parsing (``ns`` from :func:`build_parser`)."""
    base = flags.build(TrainConfig, {k: v for k, v in vars(ns).items() if not k.startswith("progpo")})
    env = base.env.resolved(pool="local")
    adv = advantage_config(ns, base.algo.advantage.estimator, env.max_steps)
    try:
        return dataclasses.replace(base, env=env, progpo=adv)
    except ValueError as exc:
        raise flags._flag_error(exc, TrainConfig, ()) from exc  # noqa: SLF001
