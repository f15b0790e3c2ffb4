"""``python -m research learning-lm``: the learning benchmark with a transformer policy trained by the
product's own trainer on the synthetic envs.

Where ``python -m research learning`` trains a log-linear policy over hand-made features, this
mode trains the small transformer policy of :mod:`progpo.run.agent_model` (``tiny-agent``: it reads the raw
prompt text) with the local backend of ``python -m progpo.cli.train`` (:class:`progpo.trainer.loop.Trainer`:
templates, sampling, action parsing, env protocol, estimators, PPO update), on the synthetic envs
``alfworld_like`` and ``webshop_like`` (:mod:`progpo.envs.synthetic`). Per env:

1. **warm start**: behaviour cloning from the env's expert (``progpo.cli.sft``, the product's SFT command,
   run as a subprocess), once; every run starts from that checkpoint;
2. **learning-rate sweep**: every row runs every rate of ``--lr_sweep`` on ``--sweep_seeds`` seeds of its
   own (1000, 1001, ...) and keeps the rate with the fewest collapsed seeds, then the smallest restricted
   mean env steps to ``--target`` (``research.learning_report.pick_lr``);
3. **final runs**: ``--seeds`` seeds (0..n-1) that took no part in the choice, each row at its rate.

Tasks (``--regime``, the word of ``research learning``): ``fixed`` trains on a pool of ``--pool`` train-split
tasks ``0..P-1`` (default ``P = --rollout.batch_size``: the same tasks every iteration; the warm start clones the expert on
them), ``--rollout.batch_size`` of them per iteration in the trainer's seeded order (every row sees the same tasks at one
seed), ``--rollout.n_samples_per_prompt`` episodes each. ``fresh`` draws new tasks from the whole train split every iteration;
there the warm start must clone the family, not a few tasks: with 1,600 tasks for 8 epochs (the fresh
regime's default; batch 8 summed over micro-batches of 2, :data:`FRESH_CLONE_NOTE` says why) the
``alfworld_like`` clone wins some episodes on unseen test tasks, where 800 tasks for 1 epoch won none (the
counts: docs/fidelity.md, "Fresh tasks").
Each regime has its own defaults (:data:`REGIME_DEFAULTS`; an explicit flag wins), report, docs block and
output folder (:func:`block_name`).

Rows are the learning benchmark's (``ESTIMATOR [preset=NAME] [field=value ...]``,
:func:`research.learning.parse_rows`), handed to the trainer as ``train`` flags (:func:`row_flags`).
Reported with the lab's statistics (:mod:`research.survival`, :mod:`research.learning_report`):
censored steps to 50% and to ``--target``, the restricted-mean ratio to ``--reference`` with a bootstrap
interval, final success (last 5 iterations) with 95% intervals over seeds, warm-start success (the first
iteration), collapsed seeds (:func:`research.survival.collapse`, the lab's rule), and the cost.

No ``oracle`` row: the exact advantage of the transformer's own policy cannot be computed (see
:data:`NO_ORACLE`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from research import learning_report as lr_report
from research import report
from research.fidelity_core import ORACLE_ROW, Variant, config_base, mean_ci
from research.learner import RunResult, RunSpec
from research.learning import SWEEP_SEED0, check_reference, parse_lr_grid, parse_rows
from research.survival import fmt_steps
from progpo.bounds import check_fields, number
from progpo.run import flags
from progpo.run.settings import EnvSettings, RolloutSettings
from progpo.trainer.config import SFTSettings
from progpo.trainer.settings import AlgoSettings, KLSettings
from research import settings as lab_settings
from research.settings import LabTrainSettings, check_counts, rollout_section, train_section

DEFAULT_ROWS = ("grpo", "gigpo", "hgpo", "progpo", "progpo preset=paper")

#: The warm start's batch (episodes' step samples per optimizer step) in every regime; ``sft_micro_batch`` below
#: only splits its sum.
SFT_BATCH = 8

#: Defaults that depend on ``--regime`` (flag name -> value); a flag given on the command line wins. Fixed
#: tasks: the warm start clones the training tasks themselves. Fresh tasks: it must clone the family (see
#: the module docstring), and more tasks per iteration with fewer episodes each keep the batch's cost.
#: ``sft_micro_batch`` (no flag) is the warm start's ``--train.micro_batch_size``: 2, the sft command's own
#: default, for fresh tasks, because that is the command whose clone reads the family (see
#: :data:`FRESH_CLONE_NOTE`); 8 for fixed tasks, as their block was made.
REGIME_DEFAULTS: dict[str, dict[str, object]] = {
    "fixed": {"tasks": 2, "rollouts": 16, "iterations": 16, "sft_tasks": 170, "sft_epochs": 1,
              "lr_sweep": "1e-3,2e-3", "sft_micro_batch": 8},
    "fresh": {"tasks": 4, "rollouts": 8, "iterations": 16, "sft_tasks": 1600, "sft_epochs": 8,
              "lr_sweep": "3e-4,1e-3", "sft_micro_batch": 2},
}

FRESH_CLONE_NOTE = (
    "The fresh-task clone learns to copy a receptacle's number from the observation in a jump, not gradually, "
    "and whether 8 epochs reach the jump depends on the run's rounding: the same 8,832 samples, lr 3e-3 and "
    "batch 8, with the gradient summed over micro-batches of 2 (the sft command's default), jump between "
    "epochs 5 and 6 (NLL 0.112 -> 0.058, final 0.046; `research clone`: open/take/put 0.98-1.00 = expert); summed "
    "over one micro-batch of 8 they stall (final 0.105 at seed 0, 0.137 at seed 1; the clone writes "
    "'receptacle 1' for every number, open/take/put 0.16-0.40, and wins 1 of 64 unseen tasks). The micro-batch "
    "does not change the gradient, only its floating-point sum; measured 2026-12-04.")

NO_ORACLE = (
    "no oracle row: the exact advantage of the transformer's own policy cannot be computed here. (1) Its policy "
    "is over token strings sampled at temperature 1: the probability of an env action is a sum over every think "
    "text and answer string that parses to it (and the rest of the mass goes to invalid answers), which has no "
    "closed form and cannot be enumerated; scoring one canonical answer per admissible action gives the values "
    "of a different policy. (2) Its prompt holds the step counter and the last --history (observation, action) "
    "turns, so even that policy's exact values need one node per (latent state, shown history, step) and one "
    "forward pass per admissible action at each node, for every task of every batch"
)


@dataclass
class LMRunResult(RunResult):
    """A :class:`~research.learner.RunResult` of one transformer run, plus its other curves ``[I]`` (per
    iteration): WebShop-like score in [0, 1] (NaN where no episode reported one), share of answers that break
    the ``<think>``/``<action>`` format, share of steps whose action the env did not admit; ``wall_s``: the
    run's wall seconds."""

    score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    invalid: np.ndarray = field(default_factory=lambda: np.zeros(0))
    env_invalid: np.ndarray = field(default_factory=lambda: np.zeros(0))
    wall_s: float = 0.0
    resumed: bool = False  #: read back from the run folder of an earlier invocation with the same flags


def _synthetic_envs() -> list[str]:
    from progpo.run.agent_model import synthetic_env_names

    return list(synthetic_env_names())


def _fixed(name: str) -> Any:
    return REGIME_DEFAULTS["fixed"][name]


@dataclass(frozen=True)
class LearningLMArgs:
    """The flags of ``python -m research learning-lm``. The defaults shown are ``--regime fixed``'s; ``--regime``
    sets those of :data:`REGIME_DEFAULTS` (:meth:`for_regime`), and a flag given on the command line wins."""

    envs: str = field(default_factory=lambda: ",".join(_synthetic_envs()))
    """comma list of synthetic envs (alfworld_like, webshop_like)"""
    estimators: str = ",".join(DEFAULT_ROWS)
    """comma list of rows (as research learning)"""
    regime: Literal["fixed", "fresh"] = "fixed"  # help: _REGIME_HELP, in the class docstring
    lr_sweep: str = field(default_factory=lambda: _fixed("lr_sweep"))
    """comma list of learning rates; each row runs at its best"""
    sweep_seeds: int = 1
    """seeds per (row, lr) of the sweep (seeds 1000+)"""
    seeds: int = 5
    """final seeds per row (0..n-1)"""
    train: LabTrainSettings = train_section("num_iterations", num_iterations=_fixed("iterations"))
    rollout: RolloutSettings = rollout_section("batch_size", "n_samples_per_prompt", batch_size=_fixed("tasks"),
                                               n_samples_per_prompt=_fixed("rollouts"))
    env: EnvSettings = field(default_factory=lambda: EnvSettings(max_steps=8, history_length=1),
                             metadata={"flags": ("max_steps", "history_length")})
    sft: SFTSettings = field(default_factory=lambda: SFTSettings(num_tasks=_fixed("sft_tasks"),
                                                                 max_epochs=_fixed("sft_epochs"), lr=3e-3),
                             metadata={"flags": ("num_tasks", "max_epochs", "lr")})
    algo: AlgoSettings = field(default_factory=lambda: AlgoSettings(kl=KLSettings(init_coef=0.0)),
                               metadata={"skip": ("kl.estimator", "advantage")})  # rows: --estimators
    pool: int | None = None
    """fixed regime: training tasks, train-split tasks 0..pool-1; the warm start clones them and every iteration draws --rollout.batch_size of them (the trainer's seeded shuffle); None: --rollout.batch_size"""
    target: float = number(0.5, "(0, 1]")
    """success rate whose first crossing is reported"""
    reference: str = "gigpo"
    """row of the restricted-mean ratio column ('' = none)"""
    workers: int = min(2, os.cpu_count() or 1)
    """processes (1 thread each)"""
    out: str | None = None
    """run folders and report (None: runs/bench/<block>, learning-lm or learning-lm-fresh)"""
    write_docs: bool = False
    """replace the generated block of docs/fidelity-results.md"""

    def __post_init__(self) -> None:
        check_counts(self, {"sweep_seeds": 1, "seeds": 1, "workers": 1})
        check_fields(self, lambda name: f"--{name}")
        if self.env.max_steps is None or self.env.max_steps < 1:
            raise ValueError(f"--env.max_steps must be >= 1, got {self.env.max_steps}")
        if self.sft.num_tasks < 1:
            raise ValueError(f"--sft.num_tasks must be >= 1, got {self.sft.num_tasks}")
        if self.rollout.n_samples_per_prompt < 2:
            raise ValueError("--rollout.n_samples_per_prompt must be >= 2 (a group of one has no signal), "
                             f"got {self.rollout.n_samples_per_prompt}")
        if self.regime == "fresh" and self.pool is not None:
            raise ValueError(f"--pool is for --regime fixed (fresh tasks come from the whole split), got {self.pool}")
        if self.pool is not None and self.pool < 1:
            raise ValueError(f"--pool must be >= 1, got {self.pool} (fresh tasks: --regime fresh)")
        if not parse_lr_grid(self.lr_sweep):
            raise ValueError(f"--lr_sweep needs at least one rate, got {self.lr_sweep!r}")
        envs = _synthetic_envs()
        env_list = flags.comma_list(self.envs, "--envs")
        if not env_list or any(e not in envs for e in env_list):
            raise ValueError(f"--envs must name synthetic envs of {envs}, got {self.envs!r}")
        if ORACLE_ROW in [s.strip() for s in self.estimators.split(",")]:
            raise ValueError(f"--estimators: {NO_ORACLE}")
        check_reference(self.reference)
        flags.check_writable(self.out, "--out")

    @classmethod
    def for_regime(cls, regime: str) -> LearningLMArgs:
        """The defaults of ``--regime regime`` (:data:`REGIME_DEFAULTS`)."""
        d, base = REGIME_DEFAULTS[regime], cls()
        return dataclasses.replace(
            base, regime=regime, lr_sweep=d["lr_sweep"],
            train=dataclasses.replace(base.train, num_iterations=d["iterations"]),
            rollout=dataclasses.replace(base.rollout, batch_size=d["tasks"], n_samples_per_prompt=d["rollouts"]),
            sft=dataclasses.replace(base.sft, num_tasks=d["sft_tasks"], max_epochs=d["sft_epochs"]))


#: The flags of the regime defaults (:data:`REGIME_DEFAULTS`'s names; ``sft_micro_batch`` has none).
REGIME_FLAGS = {"tasks": "--rollout.batch_size", "rollouts": "--rollout.n_samples_per_prompt",
                "iterations": "--train.num_iterations", "sft_tasks": "--sft.num_tasks", "sft_epochs": "--sft.max_epochs",
                "lr_sweep": "--lr_sweep"}


def regime_help() -> str:
    """``--regime``'s help: what each regime is and the defaults it sets, read from :data:`REGIME_DEFAULTS` (the
    defaults the help shows beside each flag are ``fixed``'s)."""
    sets = "; ".join(f"{regime}: " + ", ".join(f"{REGIME_FLAGS[k]} {v}" for k, v in d.items() if k in REGIME_FLAGS)
                     for regime, d in REGIME_DEFAULTS.items())
    return ("fixed: a pool of train-split tasks 0..pool-1, cloned by the warm start; fresh: new tasks from the whole "
            f"train split every iteration (a warm start that clones the family). Each sets its defaults ({sets}); "
            "the defaults shown below are fixed's")


LearningLMArgs.__doc__ = f"{LearningLMArgs.__doc__.rstrip()}\n\n    regime: {regime_help()}\n"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The flags (:class:`LearningLMArgs`, with ``--regime``'s defaults) as the run reads them: the trainer's
    settings under the run's names (``iterations``, ``tasks``, ``rollouts``, ``max_steps``, ``history``,
    ``sft_tasks``, ``sft_epochs``, ``sft_lr``, ``kl``, ``sft_micro_batch``), ``lrs``, ``env_list`` and ``rows``
    parsed, the pool and the output folder resolved.

    Raises:
        ValueError: naming the flag: counts < 1, a non-positive lr, a target outside (0, 1], an unknown env,
            a malformed ``--lr_sweep``, or an ``oracle`` row.
    """
    given = lab_settings.build_parser(LearningLMArgs, "python -m research learning-lm",
                                      __doc__.split("\n\n")[0]).parse_args(list(argv))
    regime = getattr(given, "regime", "fixed")
    settings = flags.build(LearningLMArgs, given, defaults=LearningLMArgs.for_regime(regime))
    args = lab_settings.flat(settings, iterations="train.num_iterations", tasks="rollout.batch_size",
                             rollouts="rollout.n_samples_per_prompt", max_steps="env.max_steps",
                             history="env.history_length", sft_tasks="sft.num_tasks", sft_epochs="sft.max_epochs",
                             sft_lr="sft.lr", kl="algo.kl.init_coef")
    args.sft_micro_batch = REGIME_DEFAULTS[regime]["sft_micro_batch"]
    if args.pool is None:
        args.pool = 0 if regime == "fresh" else args.tasks
    args.lrs = parse_lr_grid(args.lr_sweep)
    args.env_list = flags.comma_list(args.envs, "--envs")
    args.rows = parse_rows(args.estimators)
    if args.out is None:  # one folder per regime: a run folder of other flags would be removed as stale
        args.out = f"runs/bench/{block_name(args.regime, args.iterations)}"
    if args.reference and args.reference not in [r.name for r in args.rows]:
        args.reference = ""
    return args


# ---- jobs (run in worker processes) ---------------------------------------------------------------------
def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from progpo.run.process import setup_logging

    setup_logging("WARNING")


#: written into a run folder last, when its run has finished: the flags it ran with
FLAGS_FILE = "bench_flags.json"


def _cached(folder: str | Path, result: str, flags: list[str]) -> Path | None:
    """``folder / result`` when ``folder`` holds a finished run of exactly ``flags`` (its :data:`FLAGS_FILE`);
    otherwise the folder is removed (a stale or half-written run starts clean) and None is returned."""
    folder = Path(folder)
    recorded = folder / FLAGS_FILE
    if (folder / result).exists() and recorded.exists() and json.loads(recorded.read_text()) == flags:
        return folder / result
    shutil.rmtree(folder, ignore_errors=True)
    return None


def _mark_finished(folder: str | Path, flags: list[str]) -> None:
    """Record that the run of ``flags`` in ``folder`` finished (read by :func:`_cached`)."""
    (Path(folder) / FLAGS_FILE).write_text(json.dumps(flags))


def pool_flags(args: dict) -> list[str]:
    """``--env.num_tasks P`` for a task pool of ``P`` (warm start and RL), nothing for fresh tasks (``P = 0``)."""
    return ["--env.num_tasks", str(args["pool"])] if args["pool"] else []


def sft_job(env: str, out: str, args: dict) -> dict:
    """Behaviour cloning of ``env``'s expert into ``out`` by ``python -m progpo.cli.sft`` (a subprocess: the
    product's SFT command as a user runs it); skipped when ``out`` holds a finished run of the same flags.
    Returns its ``sft_summary.json``.

    Raises:
        RuntimeError: the command failed (its exit code and the end of its output).
    """
    import subprocess

    flags = ["--env.name", env, "--actor.model_name_or_path", "tiny-agent", "--ckpt.path", out,
             "--env.max_steps", str(args["max_steps"]), "--env.history_length", str(args["history"]),
             *pool_flags(args), "--sft.num_tasks", str(args["sft_tasks"]),
             "--sft.max_epochs", str(args["sft_epochs"]), "--sft.batch_size", str(SFT_BATCH),
             "--train.micro_batch_size", str(args["sft_micro_batch"]), "--sft.lr", str(args["sft_lr"]),
             "--rollout.max_new_tokens", "48", "--train.seed", "0", "--logger.progress_bar", "false"]
    summary_path = _cached(out, "sft_summary.json", flags)
    if summary_path is not None:
        return json.loads(summary_path.read_text())
    proc = subprocess.run([sys.executable, "-m", "progpo.cli.sft", *flags], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"progpo.cli.sft {shlex.join(flags)} failed (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    _mark_finished(out, flags)
    return json.loads((Path(out) / "sft_summary.json").read_text())


def row_flags(row: Variant) -> list[str]:
    """``train`` flags that select ``row``'s estimator settings: ``--algo.advantage.estimator`` and one
    ``--progpo.<field> value`` per override (so every row runs as a user would run it)."""
    out: list[str] = []
    for key, value in row.overrides:
        if key == "estimator":
            out += ["--algo.advantage.estimator", str(value)]
        else:
            out += [f"--progpo.{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return out


def train_flags(env: str, sft_path: str, row: Variant, lr: float, seed: int, args: dict, run_dir: str) -> list[str]:
    """The ``python -m progpo.cli.train`` flags of one run (the product's trainer, local backend)."""
    return ["--env.name", env, "--env.max_steps", str(args["max_steps"]),
            "--env.history_length", str(args["history"]), *pool_flags(args), "--actor.model_name_or_path", sft_path,
            "--ckpt.path", run_dir, *row_flags(row), "--rollout.batch_size", str(args["tasks"]),
            "--rollout.n_samples_per_prompt", str(args["rollouts"]), "--rollout.max_new_tokens", "48",
            "--rollout.max_prompt_tokens", "2000",  # tiny-agent's 2048-token context less the answer (train checks it)
            "--train.num_iterations", str(args["iterations"]), "--train.batch_size", "32",
            "--train.micro_batch_size", "16", "--actor.adam.lr", f"{lr:g}",
            "--actor.lr_scheduler", "constant_with_warmup", "--actor.lr_warmup_ratio", "0.1",
            "--algo.kl.init_coef", f"{args['kl']:g}", "--train.seed", str(seed), "--ckpt.save_steps", str(10**6),
            "--logger.progress_bar", "false", "--logger.tensorboard_dir", "none"]


def rl_job(job: tuple) -> LMRunResult:
    """One RL run ``(env, sft_path, row, lr, seed, args, run_dir)`` with the product's trainer
    (:class:`progpo.trainer.loop.Trainer` built from :func:`train_flags`); keeps its ``metrics.jsonl`` and
    ``result.pkl``. A run folder that already holds the result of the same flags is read back, not rerun
    (an interrupted benchmark resumes)."""
    from progpo.trainer.config import config_from_args
    from progpo.trainer.loop import Trainer

    env, sft_path, row, lr, seed, args, run_dir = job
    flags = train_flags(env, sft_path, row, lr, seed, args, run_dir)
    done = _cached(run_dir, "result.pkl", flags)
    if done is not None:
        with open(done, "rb") as fh:
            return dataclasses.replace(pickle.load(fh), resumed=True)
    c0, w0 = time.process_time(), time.perf_counter()
    history = Trainer(config_from_args(flags)).fit()
    shutil.rmtree(Path(run_dir) / "checkpoints", ignore_errors=True)  # keep metrics.jsonl only
    get = lambda key: np.array([m.get(key, np.nan) for m in history], dtype=np.float64)  # noqa: E731
    spec = RunSpec(row, lr, seed, args["iterations"], args["rollouts"])
    res = LMRunResult(spec, np.cumsum(get("rollout/num_steps")), get("env/success_rate"), np.zeros(0, np.int64), {},
                      time.process_time() - c0, {}, score=get("env/score_mean"),
                      invalid=get("rollout/invalid_format_frac"), env_invalid=get("rollout/env_invalid_frac"),
                      wall_s=time.perf_counter() - w0)
    with open(Path(run_dir) / "result.pkl", "wb") as fh:
        pickle.dump(res, fh)
    _mark_finished(run_dir, flags)
    return res


def _pool(workers: int):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_worker_init)


# ---- the benchmark --------------------------------------------------------------------------------------
def _phase(ex, env: str, sft_path: str, rows: list[Variant], lrs: dict[str, list[float]], seeds, args,
           tag: str) -> dict[str, dict[float, list[LMRunResult]]]:
    out: dict[str, dict[float, list[LMRunResult]]] = {r.name: {} for r in rows}
    conf = _settings(args)
    jobs = [(env, sft_path, row, lr, s, conf, str(Path(args.out) / env / tag / _slug(row.name) / f"lr{lr:g}_s{s}"))
            for row in rows for lr in lrs[row.name] for s in seeds]
    t0 = time.perf_counter()
    for k, res in enumerate(ex.map(rl_job, jobs), 1):
        out[res.spec.row.name].setdefault(res.spec.lr, []).append(res)
        print(f"[learning-lm] {env} {tag}: {k}/{len(jobs)} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr,
              flush=True)
    return out


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _settings(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in ("max_steps", "history", "pool", "tasks", "rollouts", "iterations", "kl", "sft_tasks",
                                          "sft_epochs", "sft_lr", "sft_micro_batch")}


def _cost(label: str, runs: list[LMRunResult], wall: float) -> str:
    cpu, wall_runs = sum(r.cpu_s for r in runs), sum(r.wall_s for r in runs)
    n_old = sum(bool(getattr(r, "resumed", False)) for r in runs)
    old = f", {n_old} of them read back from an earlier invocation" if n_old else ""
    return (f"{label}: {len(runs)} runs{old}, {wall:.0f} s wall now, {cpu:.0f} s CPU and {wall_runs:.0f} s wall in "
            f"the runs ({cpu / max(len(runs), 1):.0f} s CPU per run)")


def late_success(run: RunResult) -> float:
    """Mean training success over the second half of a run's iterations (``success[I // 2:]``): on fresh tasks
    the last 5 iterations hold 5 x ``--rollout.batch_size`` tasks, and their draw moves the final success more than the
    estimator does; the second half averages over many more."""
    return float(np.mean(run.success[len(run.success) // 2:]))


def paired_gap(runs: list[RunResult], ref: list[RunResult]) -> list[float]:
    """``late_success(run) - late_success(ref run)`` per seed both rows ran. At one seed every row draws the same
    tasks in the same order (the trainer's seeded task sampler does not depend on the policy), so the pairing
    removes the task draw's share of the spread."""
    by_seed = {r.spec.seed: r for r in ref}
    return [late_success(r) - late_success(by_seed[r.spec.seed]) for r in runs if r.spec.seed in by_seed]


def detail_table(final: dict[str, list[LMRunResult]], lrs: dict[str, float], reference: str | None = None) -> str:
    """Per row: warm-start success (first iteration), final success and score, the change with a 95% interval
    over seeds, the second-half success (:func:`late_success`) and, with a ``reference`` row, its paired
    difference to that row (:func:`paired_gap`), format-invalid share at the end, env steps and CPU seconds
    per run."""
    rows = []
    late = "second-half success"
    first_late = len(next(iter(final.values()))[0].success) // 2 + 1
    for name, runs in final.items():
        start = [float(r.success[0]) for r in runs]
        fin = lr_report.final_success(runs)
        gain = [f - s for f, s in zip(fin, start)]
        score = [float(np.nanmean(r.score[-lr_report.FINAL_WINDOW:])) for r in runs if np.isfinite(r.score).any()]
        inv = [float(np.nanmean(r.invalid[-lr_report.FINAL_WINDOW:])) for r in runs]
        env_inv = [float(np.nanmean(r.env_invalid[-lr_report.FINAL_WINDOW:])) for r in runs]
        cells = [name, f"{lrs[name]:g}", report.fmt_ci(*mean_ci(start)), report.fmt_ci(*mean_ci(fin)),
                 report.fmt_ci(*mean_ci(gain)), report.fmt_ci(*mean_ci([late_success(r) for r in runs]))]
        if reference:
            cells.append(report.fmt_ci(*mean_ci(paired_gap(runs, final[reference]))) if name != reference else "-")
        cells += [report.fmt_ci(*mean_ci(score)) if score else "-", report.fmt_ci(*mean_ci(inv)),
                  report.fmt_ci(*mean_ci(env_inv)), f"{np.mean([r.steps[-1] for r in runs]):,.0f}",
                  f"{np.mean([r.cpu_s for r in runs]):.0f}"]
        rows.append(cells)
    header = ["row", "lr", "warm-start success (iteration 1)", "final success (last 5)", "final - warm start",
              f"{late} (iterations {first_late}+)", *([f"{late} - {reference}'s, paired by seed"] if reference else []),
              "final score",
              "format-invalid share (last 5)", "inadmissible-action share (last 5)", "env steps per run",
              "CPU s per run"]
    return report.markdown_table(header, rows)


def run(args: argparse.Namespace) -> str:
    """SFT, sweep, final runs and tables for every env; returns the markdown report."""
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    rows, names = args.rows, [r.name for r in args.rows]
    parts, costs = [], []
    args.results = {}
    with _pool(args.workers) as ex:
        sft_paths = {e: str(Path(args.out) / e / "sft") for e in args.env_list}
        t1 = time.perf_counter()
        sft = dict(zip(args.env_list, ex.map(sft_job, args.env_list, sft_paths.values(),
                                             [_settings(args)] * len(args.env_list))))
        costs.append(f"warm starts: {time.perf_counter() - t1:.0f} s wall")
        for env in args.env_list:
            s = sft[env]
            t1 = time.perf_counter()
            sweep = _phase(ex, env, sft_paths[env], rows, {n: args.lrs for n in names},
                           range(SWEEP_SEED0, SWEEP_SEED0 + args.sweep_seeds), args, "sweep")
            flat = [r for by in sweep.values() for runs in by.values() for r in runs]
            costs.append(_cost(f"{env} sweep", flat, time.perf_counter() - t1))
            tau_s = lr_report.common_tau([flat], args.target)
            best = {n: lr_report.pick_lr(sweep[n], args.target, tau_s) for n in names}
            t1 = time.perf_counter()
            by = _phase(ex, env, sft_paths[env], rows, {n: [best[n]] for n in names}, range(args.seeds), args, "final")
            final = {n: by[n][best[n]] for n in names}
            costs.append(_cost(f"{env} final runs", [r for runs in final.values() for r in runs],
                               time.perf_counter() - t1))
            args.results[env] = {"sweep": sweep, "final": final, "sft": s}
            tau = lr_report.common_tau(list(final.values()), args.target)
            succ = s["expert_success"]
            parts.append(
                f"### {env}\n\nWarm start: `progpo.cli.sft` on {succ['n']} expert episodes (expert won "
                f"{succ['wins']}), {s['samples']} step samples, {len(s['epochs'])} epochs, final NLL "
                f"{s['final_nll']:.3f} nats per response token, {s['total_s']:.0f} s.\n\n"
                f"**Learning-rate sweep** ({args.sweep_seeds} seed(s) per cell, seeds {SWEEP_SEED0}+; cell: restricted "
                f"mean env steps to {args.target:.0%} at tau {fmt_steps(tau_s)} (seeds reaching), final success; bold: "
                f"the rate each row uses below)\n\n" + lr_report.sweep_table(sweep, args.target, tau_s, best)
                + f"\n\n**Learning** ({args.seeds} seeds per row, seeds 0..{args.seeds - 1}, each row at its best "
                f"rate)\n\n" + lr_report.main_table(final, best, args.target, tau, args.reference or None)
                + "\n\n" + detail_table(final, best, args.reference or None))
            report.plot_curves({n: [(r.steps, r.success) for r in runs] for n, runs in final.items()},
                               Path(args.out) / f"{block_name(args.regime, args.iterations)}-{env}.png",
                               f"{env} ({'fresh tasks' if args.pool == 0 else f'pool of {args.pool} tasks'}), "
                               f"transformer policy, {args.tasks} tasks x {args.rollouts}, "
                               f"{args.seeds} seeds, best lr each")
    if args.pool == 0:
        regime = f"**fresh** tasks: {args.tasks} new train-split tasks per iteration"
    elif args.pool == args.tasks:
        regime = f"**fixed** tasks: the same {args.tasks} train-split tasks every iteration"
    else:
        regime = f"a **pool** of {args.pool} train-split tasks, {args.tasks} drawn per iteration"
    head = (f"Transformer policy `tiny-agent` ({_model_line()}), warm-started by `progpo.cli.sft` on "
            f"{args.sft_tasks} expert episodes ({args.sft_epochs} epoch(s), lr {args.sft_lr:g}, batch {SFT_BATCH} "
            f"summed over micro-batches of {args.sft_micro_batch}), then trained by the "
            f"product's trainer (`progpo.trainer.loop.Trainer`: PPO clip 0.2, KL coefficient {args.kl:g}, "
            f"temperature 1, constant lr after a 10% warm-up) on {regime} x {args.rollouts} episodes, "
            f"{args.iterations} iterations, at most {args.max_steps} steps per episode, history window "
            f"{args.history}; rows {', '.join(f'`{n}`' for n in names)}. Success = share of the iteration's training "
            "episodes that succeeded (warm start: iteration 1; final: last 5 iterations, mean ± 95% t-interval over "
            "seeds); steps to X = env steps when the 3-iteration moving average first reaches X, censored at the "
            "budget (KM median with 95% interval; restricted mean = mean of min(steps, tau)). Collapsed: the lab's "
            "rule (`research.survival.collapse`: final success below half the best 3-iteration mean and at "
            f"least 0.1 under it). {NO_ORACLE[0].upper() + NO_ORACLE[1:]}."
            + (f" {FRESH_CLONE_NOTE}" if args.regime == "fresh" else ""))
    cost = ("Cost: " + "; ".join(costs) + f"; total {time.perf_counter() - t0:.0f} s wall; load average "
            f"{load0:.1f} at start, {os.getloadavg()[0]:.1f} at end ({os.cpu_count()} CPUs, {args.workers} workers).")
    return "\n\n".join([head, *parts, cost])


def _model_line() -> str:
    from progpo.run.agent_model import AgentModelConfig

    c = AgentModelConfig()
    return (f"Qwen2, {c.num_layers} layers, width {c.hidden_size}, {c.num_heads} heads, BPE tokenizer trained on the "
            "synthetic envs' prompts")


def block_name(regime: str, iterations: int | None = None) -> str:
    """The report's name (``OUT/{name}.md``, ``OUT/{name}-runs.pkl``), default output folder and docs/fidelity.md
    block: ``learning-lm-fresh`` for ``--regime fresh``, ``learning-lm`` for ``fixed``, plus ``-it{N}`` when
    ``iterations`` differs from the regime's default, so that one regime's or budget's block never overwrites
    another's.

    Raises:
        ValueError: an unknown regime."""
    if regime not in REGIME_DEFAULTS:
        raise ValueError(f"regime must be one of {list(REGIME_DEFAULTS)}, got {regime!r}")
    name = "learning-lm" if regime == "fixed" else f"learning-lm-{regime}"
    default = REGIME_DEFAULTS[regime]["iterations"]
    return name if iterations in (None, default) else f"{name}-it{iterations}"


def main(argv: Sequence[str]) -> int:
    """Entry point of ``python -m research learning-lm``; prints the markdown report."""
    try:
        args = parse_args(argv)
    except ValueError as exc:
        print(f"python -m research learning-lm: error: {exc}", file=sys.stderr)
        return 2
    text = run(args)
    cmd = ("python -m research learning-lm " + shlex.join(argv)).strip()
    print(text)
    report.save_report(args.out, block_name(args.regime, args.iterations), cmd, text, args.results,
                       write_docs=args.write_docs)
    return 0
