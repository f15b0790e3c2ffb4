"""Settings both backends share, one frozen dataclass per flag prefix (``--env.*``, ``--rollout.*``, ``--eval.*``).

``train``, ``train_ray``, ``sft`` and ``evaluate`` build their flags from these classes with
:mod:`progpo.run.flags`, so a setting has the same flag name, meaning and check on every CLI. A CLI that
has no use for a field leaves it out of its flags (``metadata={"flags": ...}`` on its section field);
flags OpenRLHF already defines (``--rollout.batch_size`` ...) keep OpenRLHF's definition on ``train_ray``.
Every check raises ``ValueError`` starting with the flag it names.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from progpo.advantages import AdvantageConfig
from progpo.bounds import check_fields, number
from progpo.run import flags

from progpo.envs.spec import POOLS, EnvSpec, env_ids, spec

Pool = Literal["local", "ray", "http"]


@dataclass(frozen=True)
class EnvSettings:
    """The environment, its tasks and its pool (``--env.*``)."""

    name: str = field(default="webshop", metadata={"choices": env_ids})
    """registered env id (progpo.envs): its spec gives the step limit, splits, template and service"""
    max_steps: int | None = None
    """decisions per episode (None: the env spec's: WebShop 15, ALFWorld 50)"""
    history_length: int = 2
    """K, earlier (observation, action) pairs shown in each step prompt"""
    invalid_penalty: float = number(0.1, ">= 0")
    """reward subtracted from a step whose answer breaks the <think>/<action> format"""
    data_dir: str | None = None
    """data folder holding the env's data (None: $PROGPO_DATA, ../shared/data, ~/.cache/progpo/data)"""
    url: str | None = None
    """WebShop: base URL of a running server (http://host:port) instead of starting one"""
    pool: Pool | None = None
    """local (envs in this process, threads), ray (one Ray actor per env) or http (WebShop over async HTTP); None: local on train, the env spec's on train_ray (WebShop http, ALFWorld ray)"""
    num_envs: int = 0
    """local/http pools: envs alive at once per process (0: one per concurrent episode on train, 256 per engine on train_ray)"""
    num_env_actors: int = 16
    """ray pool: env actors per process (train) or per engine (train_ray)"""
    num_cpus_per_actor: float = number(0.25, "> 0")
    """ray pool: CPUs reserved per env actor"""
    episodes_per_actor: int = 1
    """ray pool: episodes one env actor hosts at once"""
    call_timeout_s: float = number(300.0, "> 0")
    """ray pool: seconds one env actor call (reset/step) may take before the actor counts as dead"""
    start_timeout_s: float = number(600.0, "> 0")
    """ray pool: seconds an env actor may take to be placed and started before its episodes fail"""
    max_failed_frac: float = number(0.5, "[0, 1]")
    """stop the job (exit 3, one line naming the cause) when more than this share of a batch's episodes failed; a batch where all failed always stops it"""
    train_split: str | None = None
    """split the training tasks come from (None: the env spec's first split, 'train')"""
    eval_split: str | None = None
    """split of evaluation (None: the env spec's: WebShop test, ALFWorld valid_unseen)"""
    num_tasks: int | None = None
    """training tasks: indices task_offset..task_offset+num_tasks-1 of the train split (None: the rest of the split on train; on train_ray required unless --train.num_iterations or --data.prompt_dataset is given)"""
    task_offset: int = 0
    """first training task index"""
    split_size: int | None = None
    """train_ray: tasks in the split; indices wrap around modulo this (more iterations than tasks)"""
    task_dir: str | None = None
    """train_ray: where task lists are written (None: <ckpt.path>/progpo_tasks)"""

    def __post_init__(self) -> None:
        if self.name not in env_ids():
            raise ValueError(f"--env.name must be one of {list(env_ids())}, got {self.name!r}")
        s = self.spec
        for flag, value in (("--env.train_split", self.train_split), ("--env.eval_split", self.eval_split)):
            if value is not None and value not in s.splits:
                raise ValueError(f"{flag} must be one of {list(s.splits)} for {self.name}, got {value!r}")
        ints = {"max_steps": (self.max_steps, 1), "history_length": (self.history_length, 0),
                "num_envs": (self.num_envs, 0), "num_env_actors": (self.num_env_actors, 1),
                "episodes_per_actor": (self.episodes_per_actor, 1), "num_tasks": (self.num_tasks, 1),
                "task_offset": (self.task_offset, 0), "split_size": (self.split_size, 1)}
        for name, (value, low) in ints.items():
            if value is not None and value < low:
                raise ValueError(f"--env.{name} must be >= {low}, got {value}")
        check_fields(self, lambda name: f"--env.{name}")
        if self.pool is not None and self.pool not in POOLS:
            raise ValueError(f"--env.pool must be one of {list(POOLS)}, got {self.pool!r}")
        if self.pool == "http" and s.http_pool is None:
            raise ValueError(f"--env.pool http: {self.name} is not served over HTTP (its spec names no http_pool); "
                             "use local or ray")
        if self.url is not None:
            import re

            if not re.fullmatch(r"https?://[^/\s]+(/\S*)?", self.url):
                raise ValueError(f"--env.url must look like http://host:port, got {self.url!r}")

    @property
    def spec(self) -> EnvSpec:
        """The env's registered spec."""
        return spec(self.name)

    def resolved(self, *, pool: str | None = None) -> EnvSettings:
        """These settings with every None that has a spec default filled in: ``max_steps``,
        ``train_split``, ``eval_split``, and ``pool`` (``pool`` argument if given, else the spec's)."""
        s = self.spec
        return replace(self, max_steps=self.max_steps or s.max_steps, train_split=self.train_split or s.train_split,
                       eval_split=self.eval_split or s.eval_split, pool=self.pool or pool or s.pool)


@dataclass(frozen=True)
class RolloutSettings:
    """Rollout settings (``--rollout.*``; on train_ray OpenRLHF defines the first five itself)."""

    batch_size: int = 4
    """tasks (groups) per iteration"""
    n_samples_per_prompt: int = 8
    """rollouts per task, the group size N (>= 2 for every group estimator)"""
    temperature: float = number(1.0, "> 0")
    """sampling temperature (the update's log-probs are computed at it)"""
    top_p: float = number(1.0, "(0, 1]")
    """nucleus sampling mass"""
    max_new_tokens: int = 256
    """response limit per step, in tokens"""
    max_prompt_tokens: int | None = None
    """context guard of each step prompt, in tokens: oldest history dropped first, then the observation cut; with --rollout.max_new_tokens it must fit --data.max_len (train_ray) or the model's context (train), else the run is refused at start-up (None: --data.max_len - --rollout.max_new_tokens on train_ray)"""
    gen_batch_size: int = 64
    """most generation requests batched into one transformers generate call (--rollout.backend hf; train_ray: per engine)"""
    backend: Literal["hf", "vllm"] = "hf"
    """generation engine. train: hf (transformers generate on the actor's own weights) or vllm (an in-process vllm.LLM). train_ray: vllm (OpenRLHF as shipped: vLLM, flash-attn, NCCL; GPU nodes) or hf (the same job on CPU for a laptop dry run: local Ray head unless RAY_ADDRESS is set, DeepSpeed over gloo, transformers engines; docs/distributed.md)"""
    engine_dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """dtype of the vLLM engines (train: --rollout.backend vllm; train_ray: the CPU engines of --rollout.backend hf, --cpu.engine vllm; OpenRLHF builds its GPU engines in bf16): auto (train: fp32 while the actor computes in fp32, i.e. unless --ds.mixed_precision bf16 or --ds.param_dtype bf16, since a bf16 engine samples from rounded weights, another policy than the one trained; then, and on train_ray: on CPU bf16 where /proc/cpuinfo lists amx_bf16 or avx512_bf16, else fp32: bf16 is emulated and slow there; on GPUs bf16 where CUDA supports it), bf16 or fp32; the choice and its reason are logged at start-up. The actor trains in its own precision (train: --ds.mixed_precision; train_ray: --ds.param_dtype), the engine only samples (the update recomputes the behaviour log-probs)"""
    dynamic_sampling: bool = False
    """drop groups whose rollouts all got the same return (no learning signal; the return the estimator judges signal on: the discounted G_0 for ProGPO's default, the episode return for the others) from the update and draw new tasks until --rollout.batch_size groups carry signal or --rollout.dynamic_sampling_max_rounds extra rounds were played (DAPO's dynamic sampling; beside OpenRLHF's --algo.dynamic_filtering_*)"""
    dynamic_sampling_max_rounds: int = 2
    """most extra rollout rounds per iteration under --rollout.dynamic_sampling, each drawing as many new tasks as groups are missing (0: only drop)"""

    def __post_init__(self) -> None:
        for name in ("batch_size", "n_samples_per_prompt", "max_new_tokens", "gen_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.dynamic_sampling_max_rounds < 0:
            raise ValueError(f"--rollout.dynamic_sampling_max_rounds must be >= 0, got {self.dynamic_sampling_max_rounds}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"--rollout.max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        check_fields(self, lambda name: f"--rollout.{name}")


@dataclass(frozen=True)
class TrainSettings:
    """The training loop (``--train.*``): all of it on ``train`` and ``sft``; on ``train_ray`` only the run's
    length and ``max_nonfinite_skips`` (OpenRLHF's parser holds its other ``--train.*`` flags), so one field holds
    each on both backends.

    Raises:
        ValueError: a value below 1, naming the flag.
    """

    num_iterations: int | None = None
    """rollout + update iterations, each --rollout.batch_size tasks x --rollout.n_samples_per_prompt episodes then the update; None: one pass over the training tasks, ceil(tasks / --rollout.batch_size) iterations (the tasks: --env.num_tasks from --env.task_offset, on train the rest of the split without it; on train_ray --env.num_tasks or --data.prompt_dataset). Not OpenRLHF's --train.num_episodes (not offered on train_ray): an OpenRLHF episode is a pass over the prompt dataset"""
    batch_size: int = 16
    """step samples per optimizer step"""
    micro_batch_size: int = 4
    """samples per forward/backward"""
    max_epochs: int = 1
    """PPO epochs over each rollout"""
    seed: int = 42
    """seeds task order, sampling and shuffling"""
    max_nonfinite_skips: int = 3
    """stop the run (exit 5, one line naming the iteration and the flag to lower) after this many consecutive optimizer steps skipped for a non-finite loss or gradient norm; each skip is counted in loss/update_skipped_nonfinite, and an iteration with one writes no checkpoint"""

    def __post_init__(self) -> None:
        for name in ("num_iterations", "batch_size", "micro_batch_size", "max_epochs", "max_nonfinite_skips"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--train.{name} must be >= 1, got {value}")
        if self.seed < 0:  # numpy's generators take no negative seed: refused here, not deep in the run
            raise ValueError(f"--train.seed must be >= 0, got {self.seed}")

    def iterations(self, num_tasks: int, tasks_per_iteration: int) -> int:
        """The run's length in iterations: ``num_iterations``, or one pass over ``num_tasks`` tasks,
        ``ceil(num_tasks / tasks_per_iteration)`` (``tasks_per_iteration``: ``--rollout.batch_size``)."""
        if self.num_iterations is not None:
            return self.num_iterations
        return -(-num_tasks // tasks_per_iteration)


def max_optimizer_steps(iterations: int, max_epochs: int, tasks_per_iteration: int, n_samples_per_prompt: int,
                        max_env_steps: int, train_batch_size: int) -> int:
    """The most optimizer steps a step-level run can take: the length of its lr schedule, on both backends.

    ``iterations * max_epochs * ceil(tasks_per_iteration * n_samples_per_prompt * max_env_steps / train_batch_size)``:
    every episode of an iteration runs to the step limit and gives one step sample per step, and each
    ``train_batch_size`` step samples make one optimizer step. A run whose episodes end earlier stops before the
    end of the schedule's decay. (OpenRLHF's own length, ``prompts * n_samples_per_prompt // train_batch_size *
    num_episodes * max_epochs``, counts one sample per trajectory: with step samples it ends the warm-up and decay
    ``max_env_steps`` times too early.)

    Args:
        iterations: rollout + update iterations of the run.
        max_epochs: PPO epochs over each rollout (``--train.max_epochs``).
        tasks_per_iteration: ``--rollout.batch_size``.
        n_samples_per_prompt: episodes per task (``--rollout.n_samples_per_prompt``).
        max_env_steps: the env's step limit (``--env.max_steps``, resolved).
        train_batch_size: step samples per optimizer step (``--train.batch_size``, all ranks together).

    Raises:
        ValueError: an argument below 1, naming it.
    """
    given = {"iterations": iterations, "max_epochs": max_epochs, "tasks_per_iteration": tasks_per_iteration,
             "n_samples_per_prompt": n_samples_per_prompt, "max_env_steps": max_env_steps,
             "train_batch_size": train_batch_size}
    for name, value in given.items():
        if value < 1:
            raise ValueError(f"max_optimizer_steps: {name} must be >= 1, got {value}")
    samples = tasks_per_iteration * n_samples_per_prompt * max_env_steps
    return iterations * max_epochs * -(-samples // train_batch_size)


@dataclass(frozen=True)
class EvalSettings:
    """Evaluation on a fixed split (``--eval.*``)."""

    num_tasks: int | None = None
    """tasks 0..N-1 of --env.eval_split (None: the whole split; train_ray: 0 = no evaluation)"""
    task_offset: int = 0
    """evaluate: first task index (tasks task_offset..task_offset+N-1)"""
    n_samples: int = 1
    """episodes per task"""
    seed: int = 0
    """sampling seed of the evaluation episodes"""

    def __post_init__(self) -> None:
        if self.num_tasks is not None and self.num_tasks < 0:
            raise ValueError(f"--eval.num_tasks must be >= 0, got {self.num_tasks}")
        if self.seed < 0:
            raise ValueError(f"--eval.seed must be >= 0, got {self.seed}")
        if self.n_samples < 1:
            raise ValueError(f"--eval.n_samples must be >= 1, got {self.n_samples}")
        if self.task_offset < 0:
            raise ValueError(f"--eval.task_offset must be >= 0, got {self.task_offset}")


def check_group_size(estimator: str, n_samples_per_prompt: int) -> None:
    """Refuse a group size under which a group estimator can never produce a signal (both backends).

    Raises:
        ValueError: ``progpo.advantages.registry.group_size_error``'s line, naming
            ``--rollout.n_samples_per_prompt``, for an estimator of the registry with ``N < 2``.
    """
    from progpo.advantages.registry import ESTIMATORS, group_size_error

    error = group_size_error(n_samples_per_prompt) if estimator in ESTIMATORS else None
    if error is not None:
        raise ValueError(error)


def check_prompt_budget(max_prompt_tokens: int | None, max_new_tokens: int, max_len: int, limit: str) -> None:
    """Refuse a step prompt budget that does not fit the sequence limit with the answer (both backends).

    A step's sequence is its prompt (at most ``--rollout.max_prompt_tokens`` after the context guard) plus its
    answer (at most ``--rollout.max_new_tokens``); a budget over the limit lets a long history reach the engine
    as a prompt it must refuse (one failed episode each) instead of being shortened by the guard.

    Args:
        max_prompt_tokens: ``--rollout.max_prompt_tokens`` (None: the limit minus the answer, which fits).
        max_new_tokens: ``--rollout.max_new_tokens``, in tokens.
        max_len: the limit, in tokens.
        limit: how the limit reads in the message (``--data.max_len 2560``, or the model's context).

    Raises:
        FlagError: naming ``--rollout.max_prompt_tokens`` (or ``--rollout.max_new_tokens`` when the answer
            alone leaves no room for a prompt), with both flags, their values, the sum and the limit.
    """
    if max_new_tokens >= max_len:
        raise flags.FlagError("--rollout.max_new_tokens", f"{max_new_tokens} must be < {limit}: the answer alone "
                                                          "leaves no room for a prompt")
    if max_prompt_tokens is not None and max_prompt_tokens + max_new_tokens > max_len:
        text = (f"--rollout.max_prompt_tokens {max_prompt_tokens} + --rollout.max_new_tokens {max_new_tokens} = "
                f"{max_prompt_tokens + max_new_tokens} tokens do not fit {limit}: lower --rollout.max_prompt_tokens "
                f"to at most {max_len - max_new_tokens} (or leave it unset), or lower --rollout.max_new_tokens")
        raise flags.FlagError("--rollout.max_prompt_tokens", text, text=text)


# ---- the estimator's flags (shared by train and train_ray) ------------------------------------
def add_advantage_flags(parser: argparse.ArgumentParser) -> list[flags.Flag]:
    """``--progpo.preset`` and one ``--progpo.<field>`` flag per ``AdvantageConfig`` field (not ``estimator``)."""
    from progpo.advantages import PRESETS
    from progpo.advantages.config import PRESET_ESTIMATOR

    group = parser.add_argument_group("estimator (progpo.advantages.AdvantageConfig; unset = the preset's or its default)")
    group.add_argument("--progpo.preset", dest="progpo_preset", default=None, metavar="NAME",
                       help=f"named AdvantageConfig preset, one of {list(PRESETS)} (paper = the spec's paper reading; "
                            f"{', '.join(PRESET_ESTIMATOR)} = those papers' own settings, each with its own "
                            "--algo.advantage.estimator only); "
                            "individual --progpo.<field> flags override it (default: none, the product defaults)")
    added = flags.add_flags(group, AdvantageConfig, prefix=("progpo",), skip=("estimator",))
    return added


def advantage_config(values: dict[str, Any] | argparse.Namespace, estimator: str, max_steps: int) -> AdvantageConfig:
    """``AdvantageConfig`` from its dataclass defaults, then ``--progpo.preset``, then the env's step limit
    (``max_steps``: the estimators' horizon H), then each ``--progpo.<field>`` given.

    Raises:
        FlagError: naming ``--progpo.preset``, ``--progpo.<field>`` or ``--algo.advantage.estimator``.
    """
    from progpo.advantages.config import preset_estimator_error, preset_fields

    ns = dict(vars(values)) if isinstance(values, argparse.Namespace) else dict(values)
    given = flags.given_flags(ns, "progpo")
    for flag in flags.iter_flags(AdvantageConfig, ("progpo",)):  # a number out of range: the flag's own line
        error = flag.refusal(given.get(flag.path[-1]))
        if error is not None:
            raise error
    given.setdefault("max_steps", max_steps)
    preset = ns.get("progpo_preset")
    if preset is not None:
        try:
            given = {**preset_fields(preset), **given}
        except ValueError as exc:
            raise flags.FlagError("--progpo.preset", str(exc)) from None
        error = preset_estimator_error(preset, estimator)
        if error:
            raise flags.FlagError("--progpo.preset", error)
    try:
        return AdvantageConfig(estimator=estimator, **given)
    except (ValueError, TypeError) as exc:
        err = flags._flag_error(exc, AdvantageConfig, ("progpo",))  # noqa: SLF001 - the one mapping of field -> flag
        if err.flag == "--progpo.estimator":
            raise flags.FlagError("--algo.advantage.estimator", err.message) from exc
        raise err from exc
