"""``python -m benchmarks advantages``: estimator speed on a realistic rollout batch.

Builds an ALFWorld-like batch (16 tasks x 8 trajectories x up to 50 steps, repeated observation texts,
see ``benchmarks.synthetic_batches.alfworld_like_batch``), then prints a markdown table of the median
milliseconds over ``--runs`` calls of ``compute_advantages`` per estimator (diagnostics full and basic, and
the full time per task group: the batch's time over its ``--rollout.batch_size`` groups),
ProGPO variants, and ProGPO's time split (grouping / potentials / embeddings / fusion). Targets:
ProGPO without embeddings <= 1.5x GiGPO and <= 250 ms; embedding time is reported separately.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field

from progpo.advantages import ESTIMATORS, AdvantageConfig, compute_advantages
from progpo.advantages.config import PRESET_ESTIMATOR, preset_fields
from progpo.advantages.progpo import progpo_estimate
from benchmarks import cli
from benchmarks.synthetic_batches import alfworld_like_batch
from progpo.run.settings import EnvSettings, RolloutSettings, TrainSettings


@dataclass(frozen=True)
class AdvantagesBench:
    """The flags of ``python -m benchmarks advantages``: the batch's shape in the trainer's settings."""

    runs: int = 20
    """timed calls per row (median reported)"""
    rollout: RolloutSettings = field(default_factory=lambda: RolloutSettings(batch_size=16, n_samples_per_prompt=8),
                                     metadata={"flags": ("batch_size", "n_samples_per_prompt")})
    env: EnvSettings = field(default_factory=lambda: EnvSettings(name="alfworld", max_steps=50),
                             metadata={"flags": ("max_steps",)})
    train: TrainSettings = field(default_factory=lambda: TrainSettings(seed=0), metadata={"flags": ("seed",)})
    no_embeddings: bool = False
    """skip the MiniLM semantic-expansion rows"""

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError(f"--runs must be >= 1, got {self.runs}")
        if self.env.max_steps is None:
            raise ValueError("--env.max_steps must be >= 1, got None")


VARIANTS = {
    "progpo loo": dict(potential_pool="loo"),
    "progpo ivw_bias": dict(fusion="ivw_bias"),
    "progpo history prefix": dict(prefix_mode="history"),
    "progpo obs_inventory (E3)": dict(state_key="obs_inventory"),
    "progpo potential_target=closure": dict(potential_target="closure"),
    "progpo graph (E1)": dict(potential_estimator="graph"),
    "progpo graph+action (E1+E2)": dict(potential_estimator="graph", credit="action", credit_lambda=0.0),
}


def _median_ms(fn, runs: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _interleaved_median_ms(calls: dict, runs: int, warmup: int = 2) -> dict:
    """Median ms per call, timing the calls round-robin so that load swings hit all of them alike."""
    times: dict = {key: [] for key in calls}
    for r in range(warmup + runs):
        for key, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            if r >= warmup:
                times[key].append((time.perf_counter() - t0) * 1e3)
    return {key: statistics.median(v) for key, v in times.items()}


def _split(batch, cfg, encoder, runs: int, clear=None) -> dict[str, float]:
    """Median ms per ProGPO stage over ``runs`` calls (``clear()`` before each: cold embedding cache)."""
    per_stage: dict[str, list[float]] = {}
    for k in range(runs + 1):
        if clear is not None:
            clear()
        timings: dict[str, float] = {}
        progpo_estimate(batch, cfg, encoder, timings)
        if k == 0:
            continue  # warm-up
        for stage in ("grouping", "potentials", "embeddings", "fusion"):
            per_stage.setdefault(stage, []).append(timings.get(stage, 0.0))
    return {stage: statistics.median(v) for stage, v in per_stage.items()}


def bench_configs(max_steps: int) -> dict[str, AdvantageConfig]:
    """The timed rows: every estimator with its own defaults (PGPO, CRBC, GRAFT: their paper's preset, the
    preset of the same name), then ProGPO's variants.

    Each estimator is built from scratch: ``dataclasses.replace`` on ProGPO's resolved config would hand
    GiGPO/HGPO/GRPO/RLOO ProGPO's estimator-dependent defaults (``depths`` 0, per-task zeroing).
    """
    base = AdvantageConfig(max_steps=max_steps)
    configs = {name: AdvantageConfig(estimator=name, max_steps=max_steps,
                                     **(preset_fields(name) if PRESET_ESTIMATOR.get(name) == name else {}))
               for name in ESTIMATORS}
    configs.update({label: dataclasses.replace(base, **kw) for label, kw in VARIANTS.items()})
    return configs


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print markdown tables; returns 0 (exit 2 on a bad flag, before any work)."""
    parser = cli.settings_parser(AdvantagesBench, "python -m benchmarks advantages", __doc__.split("\n")[0])
    settings = cli.parse(AdvantagesBench, parser, argv)
    tasks, trajectories = settings.rollout.batch_size, settings.rollout.n_samples_per_prompt
    max_steps, runs = settings.env.max_steps, settings.runs

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} CPUs, load average {load:.1f} at start (timings scale with contention)")
    batch = alfworld_like_batch(tasks, trajectories, max_steps, seed=settings.train.seed)
    n_text = len(set(batch.anchor_obs.tolist()))
    print(f"batch: {batch.num_steps} steps, {tasks} tasks x {trajectories} trajectories, "
          f"up to {max_steps} steps, {n_text} unique observation texts; median of {runs} runs\n")
    base = AdvantageConfig(max_steps=max_steps)
    configs = bench_configs(max_steps)
    calls = {}
    for label, cfg in configs.items():
        for mode in ("full", "basic"):
            c = dataclasses.replace(cfg, diagnostics=mode)
            calls[(label, mode)] = lambda c=c: compute_advantages(batch, c)
    med = _interleaved_median_ms(calls, runs)
    rows = [(label, med[(label, "full")], med[(label, "basic")]) for label in configs]
    gigpo = {r[0]: r for r in rows}["gigpo"]
    print("| estimator (no embeddings) | median ms, diagnostics=full | ms per group | x GiGPO "
          "| median ms, diagnostics=basic | x GiGPO |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, full_ms, basic_ms in rows:
        print(f"| {name} | {full_ms:.1f} | {full_ms / tasks:.2f} | {full_ms / gigpo[1]:.2f} | {basic_ms:.1f} "
              f"| {basic_ms / gigpo[2]:.2f} |")
    split = _split(batch, base, None, runs)
    print("\nProGPO time split, no embeddings (median ms per stage):\n")
    print("| grouping | potentials | embeddings | fusion |")
    print("|---:|---:|---:|---:|")
    print(f"| {split['grouping']:.1f} | {split['potentials']:.1f} | {split['embeddings']:.1f} | {split['fusion']:.1f} |")
    progpo_ms = {r[0]: r for r in rows}["progpo"][1]
    ok = progpo_ms <= 1.5 * gigpo[1] and progpo_ms <= 250
    print(f"\ntarget ProGPO <= 1.5x GiGPO and <= 250 ms (diagnostics=full): {progpo_ms:.1f} ms, "
          f"{progpo_ms / gigpo[1]:.2f}x -> {'met' if ok else 'MISSED'}")
    if not settings.no_embeddings:
        _embedding_rows(batch, base, runs)
    return 0


def _embedding_rows(batch, base: AdvantageConfig, runs: int) -> None:
    """ProGPO with the real MiniLM encoder: model load once, then per-batch embedding + expansion time."""
    try:
        from progpo.advantages.embeddings import default_encoder

        t0 = time.perf_counter()
        enc = default_encoder()
        load_ms = (time.perf_counter() - t0) * 1e3
    except ImportError as exc:
        print(f"\n(semantic expansion rows skipped: {exc})")
        return
    print(f"\nWith semantic expansion (all-MiniLM-L6-v2 on CPU; model load once per process: {load_ms:.0f} ms):\n")
    print("| configuration | embedding cache | median ms total | grouping | potentials | embeddings (encode + expand) | fusion |")
    print("|---|---|---:|---:|---:|---:|---:|")
    n = max(3, runs // 4)
    for label, kw in (("progpo", {}), ("progpo graph (E1, merged nodes)", dict(potential_estimator="graph"))):
        cfg = dataclasses.replace(base, **kw)
        for cache in ("cold", "warm"):
            def call(c=cfg, cold=cache == "cold"):
                if cold:
                    enc.clear_cache()
                return compute_advantages(batch, c, enc)

            total = _median_ms(call, n, warmup=1)
            s = _split(batch, cfg, enc, n, clear=enc.clear_cache if cache == "cold" else None)
            print(f"| {label} | {cache} | {total:.1f} | {s['grouping']:.1f} | {s['potentials']:.1f} | "
                  f"{s['embeddings']:.1f} | {s['fusion']:.1f} |")
