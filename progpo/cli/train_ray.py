"""``python -m progpo.cli.train_ray``: OpenRLHF's Ray PPO trainer with ProGPO's step-level estimators.

Accepts every flag of OpenRLHF 0.11.2's ``train_ppo_ray`` (its own parser, unchanged) plus:

* ``--advantage_estimator`` -- ours (``progpo``, ``gigpo``, ``grpo``, ``rloo``, ``hgpo``: per-step
  samples, our registry) or any of OpenRLHF's (``--algo.advantage.estimator`` choices);
* ``--progpo.<field>`` -- one flag per field of ``progpo.advantages.AdvantageConfig``, generated
  from ``dataclasses.fields`` (help text = the field's docstring line);
* ``--progpo.preset NAME`` -- a named ``AdvantageConfig`` preset (``paper``, ``default``, ``candidate``),
  applied before the individual ``--progpo.<field>`` flags, which override it;
* ``--env.*`` -- the environment and episode loop (:class:`progpo.openrlhf.agent.AgentConfig`)
  and the task list that becomes OpenRLHF's prompt dataset;
* ``--device cpu`` and ``--cpu.*`` -- the whole job on CPU (a local Ray head, OpenRLHF's own
  actors, DeepSpeed over gloo, a transformers engine; :mod:`progpo.openrlhf.cpu`), to debug a
  launch on a laptop before a cluster run;
* ``--debug.*`` -- run checks: the actor-engine weight difference after each sync, dumps of the
  step batches and of the rows the actor trained on.

``--help`` works without the GPU stack (vLLM, flash-attn). A bad value exits with status 2 and one
line naming the flag, plus a hint. See ``docs/distributed.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
import math
import os
import re
import sys
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

OUR_ESTIMATORS = ("progpo", "gigpo", "grpo", "rloo", "hgpo")
DEVICES = ("cuda", "cpu")
MODEL_ALIASES = ("tiny", "smollm2-135m")
HELP_HINT = "python -m progpo.cli.train_ray --help lists every flag"
DEFAULT_MAX_STEPS = {"webshop": 15, "alfworld": 50}
DEFAULT_POOL = {"webshop": "http", "alfworld": "ray"}
AGENT_FILE = Path(__file__).resolve().parent.parent / "openrlhf" / "agent_file.py"


def _field_help(cls: type) -> dict[str, str]:
    """``name -> text`` from the ``Attributes:`` section of a dataclass docstring."""
    out: dict[str, str] = {}
    for line in (cls.__doc__ or "").splitlines():
        m = re.match(r"\s{8}(\w+): (.*)", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def add_config_flags(parser: argparse.ArgumentParser, cls: type, prefix: str, skip: tuple[str, ...] = ()) -> list[str]:
    """Add ``--{prefix}.{field}`` for every field of frozen dataclass ``cls`` (except ``skip``).

    Types: ``bool`` (``true``/``false``), ``int``, ``float``, ``str``, ``Literal[...]`` (choices).
    Flags default to "not given" so the dataclass keeps its own defaults (shown in the help).

    Returns:
        The field names that got a flag.

    Raises:
        TypeError: a field type with no flag mapping (extend this function, not the config).
    """
    hints = typing.get_type_hints(cls)
    helps = _field_help(cls)
    group = parser.add_argument_group(f"{prefix} ({cls.__name__})")
    names = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        tp, kwargs = hints[f.name], {}
        if typing.get_origin(tp) is typing.Literal:
            choices = typing.get_args(tp)
            kwargs.update(choices=choices, type=type(choices[0]))
        elif tp is bool:
            kwargs.update(type=_bool, metavar="{true,false}")
        elif tp in (int, float, str):
            kwargs.update(type=tp)
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no command-line mapping for type {tp!r}")
        default = f.default if f.default is not dataclasses.MISSING else None
        group.add_argument(
            f"--{prefix}.{f.name}", dest=f"{prefix}.{f.name}", default=argparse.SUPPRESS,
            help=f"{helps.get(f.name, '')} (default: {default})", **kwargs,
        )
        names.append(f.name)
    return names


def add_env_flags(parser: argparse.ArgumentParser) -> None:
    """The ``--env.*`` flags: environment, episode loop and task list."""
    g = parser.add_argument_group("env (environment, episode loop, tasks)")
    g.add_argument("--env.name", choices=("webshop", "alfworld"), default=None, help="environment (required)")
    g.add_argument("--env.pool", choices=("http", "ray", "local"), default=None,
                   help="env pool: http (WebShop, async HTTP), ray (Ray env actors), local (threads); "
                        "default: http for webshop, ray for alfworld")
    g.add_argument("--env.url", default=None, help="WebShop server base URL, e.g. http://HEAD_IP:3000")
    g.add_argument("--env.data_dir", default=None, help="env data folder (default: $PROGPO_DATA or ../shared/data)")
    g.add_argument("--env.max_steps", type=int, default=None, help="steps per episode (default 15 webshop, 50 alfworld)")
    g.add_argument("--env.history_length", type=int, default=2, help="K, history turns in each step prompt")
    g.add_argument("--env.invalid_penalty", type=float, default=0.1, help="reward penalty for a malformed answer")
    g.add_argument("--env.max_prompt_tokens", type=int, default=None, help="step prompt token limit")
    g.add_argument("--env.num_env_actors", type=int, default=16, help="Ray env actors per vLLM engine")
    g.add_argument("--env.num_cpus_per_actor", type=float, default=0.25, help="CPUs per Ray env actor")
    g.add_argument("--env.episodes_per_actor", type=int, default=1, help="episodes one Ray env actor hosts at once")
    g.add_argument("--env.max_failed_frac", type=float, default=0.5,
                   help="stop the job when more than this share of a batch's episodes failed (all failed always stops)")
    g.add_argument("--env.call_timeout_s", type=float, default=300.0,
                   help="seconds one Ray env actor call (reset/step) may take before the actor counts as dead")
    g.add_argument("--env.start_timeout_s", type=float, default=600.0,
                   help="seconds a Ray env actor may take to be placed and started before its episodes fail")
    g.add_argument("--env.split", default="train", help="split the training tasks come from")
    g.add_argument("--env.num_tasks", type=int, default=None,
                   help="training tasks (indices task_offset..task_offset+num_tasks-1); required "
                        "unless --data.prompt_dataset is given")
    g.add_argument("--env.task_offset", type=int, default=0, help="first task index")
    g.add_argument("--env.split_size", type=int, default=None,
                   help="tasks in the split: indices wrap around modulo this (more iterations than tasks)")
    g.add_argument("--env.eval_split", default=None, help="evaluation split (e.g. test, valid_unseen)")
    g.add_argument("--env.num_eval_tasks", type=int, default=0, help="evaluation tasks from --env.eval_split")
    g.add_argument("--env.task_dir", default=None, help="where task lists are written (default: <ckpt.path>/progpo_tasks)")


def add_device_flags(parser: argparse.ArgumentParser) -> None:
    """``--device``, the ``--cpu.*`` settings of a CPU run and the ``--debug.*`` checks."""
    parser.add_argument("--device", choices=DEVICES, default="cuda",
                        help="cuda: OpenRLHF as shipped (vLLM, flash-attn, NCCL; GPU nodes). cpu: the same job on "
                             "CPU for a laptop dry run (local Ray head unless RAY_ADDRESS is set, DeepSpeed over "
                             "gloo, transformers engine; see docs/distributed.md)")
    g = parser.add_argument_group("cpu (--device cpu only)")
    g.add_argument("--cpu.ray_num_cpus", type=int, default=None,
                   help="logical CPU slots of the local Ray head (default: what the actors need, +1)")
    g.add_argument("--cpu.torch_threads", type=int, default=None,
                   help="torch threads per Ray worker process (default: the machine's cores)")
    g.add_argument("--cpu.engine_batch_size", type=int, default=32,
                   help="most generation requests one engine batches into one transformers generate call")
    d = parser.add_argument_group("debug (run checks)")
    d.add_argument("--debug.dump_dir", default=None,
                   help="write each iteration's step batch (experience maker) and the rows the actor trains on "
                        "(its replay buffer) there as JSON")
    d.add_argument("--debug.check_weight_sync", action="store_true", default=False,
                   help="after each weight sync, log max |actor - engine| over all parameters as sync/max_abs_diff "
                        "(and sync/max_abs_diff_before); --device cpu only")


def build_parser() -> argparse.ArgumentParser:
    """OpenRLHF's parser plus our flags.

    Imports OpenRLHF; where vLLM / flash-attn are not installed, the import shims of
    :mod:`progpo.openrlhf.cpu` stand in during the import only (nothing of them is called).
    A flag error exits with one line naming the flag plus a hint (see :func:`one_line_errors`).
    """
    from progpo.advantages import PRESETS, AdvantageConfig
    from progpo.openrlhf.cpu import import_shims

    with import_shims():
        from progpo.openrlhf.trainer import openrlhf_parser

        parser = openrlhf_parser()
    parser.prog = "python -m progpo.cli.train_ray"
    parser.description = __doc__.split("\n")[0]
    one_line_errors(parser)
    theirs = next(a for a in parser._actions if a.dest == "algo.advantage.estimator")  # noqa: SLF001
    parser.add_argument(
        "--advantage_estimator", choices=OUR_ESTIMATORS + tuple(theirs.choices), default=None,
        help="progpo|gigpo|grpo|rloo|hgpo: per-step samples and ProGPO's registry; any other value is "
             "OpenRLHF's own --algo.advantage.estimator (default: progpo)",
    )
    add_config_flags(parser, AdvantageConfig, "progpo", skip=("estimator",))
    parser.add_argument("--progpo.preset", dest="progpo_preset", default=None, metavar="NAME",
                        help=f"named AdvantageConfig preset, one of {list(PRESETS)} (paper = the spec's paper "
                             "reading); individual --progpo.<field> flags override it")
    add_env_flags(parser)
    add_device_flags(parser)
    return parser


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]  # noqa: SLF001


def error_hint(parser: argparse.ArgumentParser, message: str) -> str:
    """The hint line under a flag error: close flag names for an unknown flag, else where to look."""
    m = re.search(r"unrecognized arguments: (\S+)", message)
    if m:
        wrong = m.group(1).split("=", 1)[0]
        close = difflib.get_close_matches(wrong, _option_strings(parser), n=3, cutoff=0.6)
        if close:
            return f"did you mean {' or '.join(close)}? ({HELP_HINT})"
    m = re.search(r"argument (--[\w.]+)", message)
    if m:
        return f"python -m progpo.cli.train_ray --help | grep -A2 -- '{m.group(1)}' shows what it takes"
    return HELP_HINT


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser.error`` print ``<prog>: error: <message>`` and one hint line (no usage dump), exit 2."""

    def error(message: str) -> typing.NoReturn:
        parser.exit(2, f"{parser.prog}: error: {message}\n  hint: {error_hint(parser, message)}\n")

    parser.error = error  # type: ignore[method-assign]
    return parser


def _fail(parser: argparse.ArgumentParser, flag: str, message: str) -> typing.NoReturn:
    parser.error(f"argument {flag}: {message}")


def _advantage_config(parser: argparse.ArgumentParser, ns: dict[str, Any], estimator: str, max_steps: int) -> Any:
    """Dataclass defaults, then ``--progpo.preset``, then the env's step limit, then each ``--progpo.<field>``."""
    from progpo.advantages import AdvantageConfig
    from progpo.advantages.config import preset_fields

    given = {k.split(".", 1)[1]: v for k, v in ns.items() if k.startswith("progpo.")}
    given.setdefault("max_steps", max_steps)
    if ns.get("progpo_preset") is not None:
        try:
            given = {**preset_fields(ns["progpo_preset"]), **given}
        except ValueError as exc:
            _fail(parser, "--progpo.preset", str(exc))
    try:
        return AdvantageConfig(estimator=estimator, **given)
    except ValueError as exc:
        m = re.search(r"AdvantageConfig\.(\w+)", str(exc))
        _fail(parser, f"--progpo.{m.group(1)}" if m else "--progpo.*", str(exc))


def _agent_config(parser: argparse.ArgumentParser, ns: dict[str, Any]) -> Any:
    from progpo.openrlhf.agent import AgentConfig

    name = ns["env.name"]
    if name is None:
        _fail(parser, "--env.name", "required (webshop or alfworld)")
    kwargs: dict[str, Any] = {}
    pool = ns["env.pool"] or DEFAULT_POOL[name]
    if name == "webshop":
        if pool != "local" and not ns["env.url"]:
            _fail(parser, "--env.url", "required for webshop (the WebShop server's base URL)")
        if ns["env.url"]:
            if not re.fullmatch(r"https?://[^/\s]+(/\S*)?", ns["env.url"]):
                _fail(parser, "--env.url", f"must look like http://host:port, got {ns['env.url']!r}")
            kwargs["base_url"] = ns["env.url"]
    if ns["env.data_dir"]:
        kwargs["data_dir"] = str(Path(ns["env.data_dir"]).expanduser().resolve())  # actors run in other dirs
    if name == "alfworld":
        _alfworld_data(parser, ns["env.data_dir"])
    try:
        return AgentConfig(
            env_name=name, env_kwargs=kwargs, pool=pool,
            max_steps=DEFAULT_MAX_STEPS[name] if ns["env.max_steps"] is None else ns["env.max_steps"],
            history_length=ns["env.history_length"], invalid_penalty=ns["env.invalid_penalty"],
            max_prompt_tokens=ns["env.max_prompt_tokens"], max_new_tokens=ns["rollout.max_new_tokens"] or 512,
            num_env_actors=ns["env.num_env_actors"], num_cpus_per_actor=ns["env.num_cpus_per_actor"],
            episodes_per_actor=ns["env.episodes_per_actor"], max_failed_frac=ns["env.max_failed_frac"],
            call_timeout_s=ns["env.call_timeout_s"], start_timeout_s=ns["env.start_timeout_s"],
        )
    except ValueError as exc:
        m = re.search(r"env\.(\w+)", str(exc))
        _fail(parser, f"--env.{m.group(1)}" if m else "--env.*", str(exc))


def _per_step_checks(parser: argparse.ArgumentParser, ns: dict[str, Any], estimator: str) -> None:
    """What per-step samples need of OpenRLHF's settings (any estimator), each refusal naming its flag.

    Batch sizes that keep every data-parallel rank's collectives equal
    (:func:`progpo.openrlhf.balance.check_batch_arithmetic`); no dynamic batching (its step count
    assumes one sample per episode and would drop rows); for OpenRLHF's own estimators (episode
    advantages on every step, ``progpo.openrlhf.experience``): no critic (``gae``), ``gamma = 1``, the
    KL as a loss, no length penalties (they would apply to episodes, not steps).
    """
    from progpo.openrlhf.balance import check_batch_arithmetic

    dup = ns["ds.ring_attn_size"] * ns["ds.tensor_parallel_size"]
    actor = ns["actor.num_nodes"] * ns["actor.num_gpus_per_node"] // dup
    ref = ns["ref.num_nodes"] * ns["ref.num_gpus_per_node"] // dup if ns["algo.kl.init_coef"] > 0 else 1
    try:
        check_batch_arithmetic(train_batch=ns["train.batch_size"], train_micro=ns["train.micro_batch_size"],
                               rollout_micro=ns["rollout.micro_batch_size"], actor_ranks=actor,
                               forward_ranks=math.lcm(actor, ref))
    except ValueError as exc:
        flag = re.match(r"(--[\w.]+)", str(exc))
        _fail(parser, flag.group(1) if flag else "--train.batch_size", str(exc))
    if ns["train.dynamic_batch_enable"]:
        _fail(parser, "--train.dynamic_batch_enable", "is not supported with per-step samples (its step count "
                                                      "assumes one sample per episode and would drop step rows)")
    if estimator in OUR_ESTIMATORS:
        return
    why = f"with OpenRLHF's --advantage_estimator {estimator} on per-step samples (episode advantage on every step)"
    if estimator == "gae":
        _fail(parser, "--advantage_estimator", f"gae needs a critic; ProGPO runs critic-free ({why})")
    if ns["algo.advantage.gamma"] != 1:
        _fail(parser, "--algo.advantage.gamma", f"must be 1 {why}, got {ns['algo.advantage.gamma']}")
    if ns["algo.kl.init_coef"] > 0 and not ns["algo.kl.use_loss"]:
        _fail(parser, "--algo.kl.use_loss", f"is required {why}: a KL reward penalty would be summed over a transcript")
    for flag in ("reward.overlong_buffer_len", "reward.stop_properly_penalty_coef"):
        if ns[flag] is not None:
            _fail(parser, f"--{flag}", f"is not supported {why}: it would penalise episodes, not steps")


def _alfworld_data(parser: argparse.ArgumentParser, data_dir: str | None) -> None:
    """Exit naming ``--env.data_dir`` unless ALFWorld's games can be found from here (the folder, or the
    archive that ``progpo.envs.alfworld_data`` unpacks; :func:`ray_env_vars` sends the same data root
    to every worker)."""
    from progpo.envs.alfworld_data import ARCHIVE_NAME, resolve_data_dir
    from progpo.paths import data_root

    try:
        resolve_data_dir(data_dir, unpack=False)
    except FileNotFoundError as exc:
        if data_dir or not (data_root() / "alfworld" / ARCHIVE_NAME).is_file():
            _fail(parser, "--env.data_dir", f"{exc} (pass --env.data_dir, or set PROGPO_DATA to the data folder)")


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


def _env_splits(name: str) -> tuple[str, ...]:
    if name == "webshop":
        from progpo.envs.webshop import SPLITS
    else:
        from progpo.envs.alfworld_data import SPLITS
    return SPLITS


def _folder(parser: argparse.ArgumentParser, flag: str, path: Path) -> None:
    """Check now that folder ``path`` can be made (exit 2 naming ``flag`` if not), not later in a worker."""
    from progpo.run.checkpoint import check_run_dir

    try:
        check_run_dir(path, flag)
    except ValueError as exc:
        parser.error(f"argument {exc}")


def _tasks(parser: argparse.ArgumentParser, ns: dict[str, Any]) -> None:
    splits = _env_splits(ns["env.name"])
    for flag in ("env.split", "env.eval_split"):
        if ns[flag] is not None and ns[flag] not in splits:
            _fail(parser, f"--{flag}", f"must be one of {list(splits)} for {ns['env.name']}, got {ns[flag]!r}")
    task_dir = Path(ns["env.task_dir"] or Path(ns["ckpt.path"]) / "progpo_tasks")
    if not task_dir.is_absolute():  # actors on other nodes / in other working dirs must find it
        task_dir = Path.cwd() / task_dir
    if ns["data.prompt_dataset"] is None or (ns["env.num_eval_tasks"] and ns["eval.dataset"] is None):
        _folder(parser, "--env.task_dir" if ns["env.task_dir"] else "--ckpt.path", task_dir)
    if ns["data.prompt_dataset"] is None:
        n = ns["env.num_tasks"]
        if n is None or n < 1:
            _fail(parser, "--env.num_tasks", f"must be >= 1 when --data.prompt_dataset is not given, got {n}")
        if ns["env.task_offset"] < 0:
            _fail(parser, "--env.task_offset", f"must be >= 0, got {ns['env.task_offset']}")
        start, size = ns["env.task_offset"], ns["env.split_size"]
        if size is not None and size < 1:
            _fail(parser, "--env.split_size", f"must be >= 1, got {size}")
        indices = [(start + i) % size if size else start + i for i in range(n)]
        ns["data.prompt_dataset"] = str(write_tasks(task_dir / "train.jsonl", ns["env.split"], indices))
        ns["data.input_key"], ns["data.label_key"] = "task", "label"
    if ns["env.num_eval_tasks"] < 0:
        _fail(parser, "--env.num_eval_tasks", f"must be >= 0, got {ns['env.num_eval_tasks']}")
    if ns["env.num_eval_tasks"] and ns["eval.dataset"] is None:
        if not ns["env.eval_split"]:
            _fail(parser, "--env.eval_split", "required when --env.num_eval_tasks > 0")
        ns["eval.dataset"] = str(
            write_tasks(task_dir / "eval.jsonl", ns["env.eval_split"], range(ns["env.num_eval_tasks"]))
        )


def finalize(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Check our flags and fold them into the flat namespace OpenRLHF's main block expects.

    Adds ``progpo_advantage_config`` (an ``AdvantageConfig``, for our estimators) and
    ``progpo_agent_config_json`` (for ``PROGPO_AGENT_CONFIG``); sets ``--algo.advantage.estimator``,
    ``--train.agent_func_path`` and, unless given, the task datasets. Exits (status 2) naming a bad flag.
    """
    ns = dict(vars(args))
    _device(parser, ns)
    estimator = ns.pop("advantage_estimator") or "progpo"
    ns["algo.advantage.estimator"] = estimator
    agent = _agent_config(parser, ns)
    ours = estimator in OUR_ESTIMATORS
    ns["progpo_advantage_config"] = _advantage_config(parser, ns, estimator, agent.max_steps) if ours else None
    if not ours and (any(k.startswith("progpo.") for k in ns) or ns.get("progpo_preset") is not None):
        _fail(parser, "--progpo.*", f"only apply to --advantage_estimator in {OUR_ESTIMATORS}, not {estimator!r}")
    if ours and ns["train.async_enable"]:
        _fail(parser, "--train.async_enable", f"is not supported with --advantage_estimator {estimator}")
    if ours and ns["rollout.n_samples_per_prompt"] < 2:
        _fail(parser, "--rollout.n_samples_per_prompt", f"group estimators need >= 2, got {ns['rollout.n_samples_per_prompt']}")
    _per_step_checks(parser, ns, estimator)
    if ns["train.agent_func_path"] is None:
        ns["train.agent_func_path"] = _agent_path()
    elif not Path(ns["train.agent_func_path"]).is_file():
        _fail(parser, "--train.agent_func_path", f"no such file: {ns['train.agent_func_path']}")
    _tasks(parser, ns)
    if ns["debug.dump_dir"]:
        _folder(parser, "--debug.dump_dir", Path(ns["debug.dump_dir"]))
    ns["progpo_debug_dump_dir"] = ns["debug.dump_dir"] and str(Path(ns["debug.dump_dir"]).resolve())
    ns["progpo_debug_check_weight_sync"] = ns["debug.check_weight_sync"]
    for key in [k for k in ns if k.startswith(("progpo.", "env.", "cpu.", "debug."))]:
        ns.pop(key)
    ns.pop("progpo_preset", None)
    ns["progpo_agent_config_json"] = agent.to_json()
    return argparse.Namespace(**ns)


CPU_REFUSED = {  # flag -> (value that is refused, why): features with no CPU path
    "ds.packing_samples": (True, "packing needs flash-attention's varlen kernels"),
    "ds.load_in_4bit": (True, "bitsandbytes 4-bit needs CUDA"),
    "ds.use_liger_kernel": (True, "Liger kernels are Triton (GPU)"),
    "ds.deepcompile": (True, "DeepCompile needs a GPU"),
    "ds.adam_offload": (True, "the optimizer already lives in RAM (DeepSpeedCPUAdam would compile C++)"),
    "ds.enable_sleep": (True, "DeepSpeed's offload_states needs FusedAdam (a C++ build); the states already live in RAM"),
    "train.enable_ema": (True, "OpenRLHF's EMA update is hard-wired to cuda"),
    "train.async_enable": (True, "the CPU engine has no pause/resume (partial rollout)"),
    "vllm.sync_with_ray": (True, "Ray's gloo collective would replace DeepSpeed's process group"),
}


def _device(parser: argparse.ArgumentParser, ns: dict[str, Any]) -> None:
    """Check ``--device`` and fold it into the namespace (``progpo_device``, ``progpo_engine_kwargs``).

    CPU mode: OpenRLHF's CUDA-only defaults are switched (``--ds.attn_implementation`` flash_attention_2
    -> sdpa, ``--vllm.sync_backend`` nccl -> gloo); features without a CPU path are refused naming the
    flag; the model aliases ``tiny`` / ``smollm2-135m`` resolve to local HF folders.
    """
    device = ns.pop("device")
    ns["progpo_device"] = device
    cpu_flags = [k for k in ("cpu.ray_num_cpus", "cpu.torch_threads") if ns[k] is not None]
    if device == "cuda":
        if cpu_flags:
            _fail(parser, f"--{cpu_flags[0]}", "only applies with --device cpu")
        if ns["debug.check_weight_sync"]:
            _fail(parser, "--debug.check_weight_sync", "compares the CPU engine's weights: use it with --device cpu")
        return
    for flag, (bad, why) in CPU_REFUSED.items():
        if ns[flag] == bad:
            _fail(parser, f"--{flag}", f"not supported with --device cpu ({why})")
    for flag in ("ds.ring_attn_size", "ds.tensor_parallel_size", "vllm.tensor_parallel_size"):
        if ns[flag] != 1:
            _fail(parser, f"--{flag}", f"must be 1 with --device cpu, got {ns[flag]}")
    for flag in ("cpu.ray_num_cpus", "cpu.torch_threads", "cpu.engine_batch_size"):
        if ns[flag] is not None and ns[flag] < 1:
            _fail(parser, f"--{flag}", f"must be >= 1, got {ns[flag]}")
    attn = ns["ds.attn_implementation"]
    if attn == "flash_attention_2":  # OpenRLHF's default
        ns["ds.attn_implementation"] = "sdpa"
    elif attn not in ("sdpa", "eager"):
        _fail(parser, "--ds.attn_implementation", f"must be sdpa or eager with --device cpu, got {attn!r}")
    if ns["vllm.sync_backend"] == "nccl":  # OpenRLHF's default
        ns["vllm.sync_backend"] = "gloo"
    elif ns["vllm.sync_backend"] != "gloo":
        _fail(parser, "--vllm.sync_backend", f"must be gloo with --device cpu, got {ns['vllm.sync_backend']!r}")
    if not ns["vllm.num_engines"] or ns["vllm.num_engines"] < 1:
        _fail(parser, "--vllm.num_engines", "must be >= 1: the agent executor runs inside the engines")
    for flag in ("actor.num_nodes", "actor.num_gpus_per_node"):  # on CPU: the policy's processes
        if ns[flag] < 1:
            _fail(parser, f"--{flag}", f"must be >= 1, got {ns[flag]}")
    model = ns["actor.model_name_or_path"]
    if model in MODEL_ALIASES:
        from progpo.run.models import resolve_pretrain

        ns["actor.model_name_or_path"] = resolve_pretrain(model)
    ns["progpo_engine_kwargs"] = {"dtype": ns["ds.param_dtype"], "max_batch_size": ns["cpu.engine_batch_size"]}
    ns["progpo_ray_num_cpus"] = ns["cpu.ray_num_cpus"] or _cpu_slots(ns)
    ns["progpo_torch_threads"] = ns["cpu.torch_threads"] or os.cpu_count() or 1


def _cpu_slots(ns: dict[str, Any]) -> int:
    """Logical CPU slots a local Ray head needs: one per model process and engine, the env actors', +1
    (OpenRLHF's trainer actor needs one free slot to be placed)."""
    actor = ns["actor.num_nodes"] * ns["actor.num_gpus_per_node"]
    ref = ns["ref.num_nodes"] * ns["ref.num_gpus_per_node"]
    engines = ns["vllm.num_engines"] * ns["vllm.tensor_parallel_size"]
    pool = ns["env.pool"] or DEFAULT_POOL.get(ns["env.name"])
    env = ns["env.num_env_actors"] * ns["env.num_cpus_per_actor"] * engines if pool == "ray" else 0
    return int(actor + ref + engines + env + 0.999) + 1


def _job_runtime_env() -> dict[str, Any]:
    """The runtime env of the Ray job this driver runs in (``ray job submit``), else ``{}``."""
    text = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not text:
        return {}
    try:
        return dict(json.loads(text).get("runtime_env") or {})
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return {}


def _agent_path() -> str:
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

    ``--device cpu``: every worker first runs :func:`progpo.openrlhf.cpu.worker_setup_hook`
    (Ray's ``worker_process_setup_hook``), and without ``RAY_ADDRESS`` a new local head is started
    with ``progpo_ray_num_cpus`` logical CPUs (never an existing cluster of this machine).

    Returns:
        True when this call started a local head (the caller shuts it down).
    """
    import ray

    if ray.is_initialized():
        return False
    env_vars = ray_env_vars(args.progpo_agent_config_json)
    if args.progpo_device != "cpu":
        ray.init(runtime_env={"env_vars": env_vars})
        return False
    from progpo.openrlhf.cpu import THREADS_ENV_VAR

    env_vars[THREADS_ENV_VAR] = str(args.progpo_torch_threads)
    runtime_env = {"env_vars": env_vars,
                   "worker_process_setup_hook": "progpo.openrlhf.cpu.worker_setup_hook"}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env=runtime_env)
        return False
    logger.info("starting a local Ray head with %d logical CPUs", args.progpo_ray_num_cpus)
    ray.init(address="local", num_cpus=args.progpo_ray_num_cpus, num_gpus=0, include_dashboard=False,
             runtime_env=runtime_env)
    return True


def main(argv: list[str] | None = None) -> int:
    """Parse, check, then run OpenRLHF's training with our trainer actor (blocks until done).

    Returns 0 when training finished; a bad flag, or ``--device cuda`` without vLLM / flash-attn
    installed, exits with status 2 (one line naming the flag, plus a hint); a rollout batch whose
    failed episodes crossed ``--env.max_failed_frac`` (or all failed) exits with status 3 and one
    line naming the cause (``progpo.openrlhf.failures``), before anything more is trained or saved.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = build_parser()
    args = finalize(parser, parser.parse_args(argv))
    from progpo.openrlhf.cpu import install, missing_gpu_packages

    if args.progpo_device == "cpu":
        install()
    elif missing_gpu_packages():
        _fail(parser, "--device", f"cuda needs {' and '.join(missing_gpu_packages())} installed (pip install -r "
                                  "requirements-gpu.txt); for a CPU dry run of this job add --device cpu")
    from progpo.openrlhf.trainer import run_openrlhf_main

    from progpo.openrlhf.failures import EXIT_ROLLOUT_FAILED, RolloutFailed

    os.environ["PROGPO_AGENT_CONFIG"] = args.progpo_agent_config_json
    started = init_ray(args)
    failure = None
    try:
        run_openrlhf_main(args)
    except RolloutFailed as exc:  # raised in OpenRLHF's trainer actor; ray.get re-raises it as a subclass
        failure = " ".join(str(getattr(exc, "cause", None) or exc).split())
    finally:
        if started:
            import ray

            ray.shutdown()
            logger.info("local Ray head shut down")
    if failure is not None:  # the last line on stderr
        parser.exit(EXIT_ROLLOUT_FAILED, f"{parser.prog}: error: {failure}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
