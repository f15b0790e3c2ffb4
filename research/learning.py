"""``python -m research learning``: does better credit assignment learn faster? (no LLM)

A log-linear softmax policy over the admissible actions of a task family
(:mod:`progpo.envs.synthetic.families`: ``alfworld``-like rooms or ``webshop``-like search and select) is
trained from scratch with each estimator row's step advantages by the same REINFORCE update, on the
same tasks, seeds and budget (:mod:`research.learner`, vectorised in :mod:`research.engine`).
Rows are named estimators or specs ``ESTIMATOR [preset=NAME] [field=value ...]`` over
``AdvantageConfig``'s fields. With ``--lr_sweep`` every row first runs each learning rate on
``--sweep_seeds`` seeds of their own, and the final table runs ``--seeds`` fresh seeds at each row's
best rate (fewest collapsed sweep seeds, then smallest restricted mean steps to ``--target``); with
``--stable_range`` (the default) the final seeds also run at every other rate of the grid, so that each
row prints the rates at which none of them collapsed (:func:`research.survival.collapse`). Reported:
final success, collapsed seeds, steps to 50% and to ``--target`` with censored statistics over all seeds
(:mod:`research.survival`), the on-policy fidelity against the exact advantage of the learner's own
policy during training, the fixed-policy fidelity of the same rows, and how well each fidelity measure
ranks the rows' learning.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from research import learning_report as lr_report
from research import report
from progpo.envs.synthetic.families import AlfworldFamily, family_config, get_family, make_tasks
from research.fidelity_core import ORACLE_ROW, CachedEncoder, oracle_variant, select_variants
from research.learner import RunSpec, build_source, make_context, run_all
from research.survival import COLLAPSE_RATIO, FINAL_WINDOW, MIN_DROP, PEAK_WINDOW
from research.survival import steps_to_target  # noqa: F401  (re-exported: the benchmark's definition)
from progpo.bounds import check_fields, number
from progpo.run.flags import check_writable, comma_list
from progpo.run.settings import RolloutSettings
from research import settings as lab_settings
from research.settings import LabTrainSettings, check_counts, rollout_section, train_section

DEFAULT_ESTIMATORS = ("grpo", "gigpo", "hgpo", "g2po", "progpo", "progpo state_key=obs_inventory",
                      "gigpo state_key=obs_inventory", "hgpo state_key=obs_inventory", "g2po state_key=obs_inventory")
LEARN_CFG = AlfworldFamily.learn_cfg
SWEEP_SEED0 = 1000  #: sweep seeds are 1000, 1001, ... (the final seeds 0..n-1 are never used to pick the lr)
COLLAPSE_RULE = (f"final success (last {FINAL_WINDOW} iterations) below {COLLAPSE_RATIO:g} x the best {PEAK_WINDOW}-iteration "
                 f"mean and at least {MIN_DROP:g} under it")


@dataclass(frozen=True)
class LearningArgs:
    """The flags of ``python -m research learning``."""

    quick: bool = False
    """tiny settings for CI (< 1 min)"""
    family: str = "alfworld"
    """task family: alfworld | webshop"""
    regime: Literal["fixed", "fresh"] = "fixed"
    """fixed: the same --rollout.batch_size tasks every iteration; fresh: new tasks from a pool every iteration"""
    policy: Literal["auto", "tabular", "features"] = "auto"
    """learner parameters: per-task table or shared features (auto: tabular if fixed, else features)"""
    pool: int = 0
    """fresh regime: pool size (0 = iterations x tasks, no repeats)"""
    task_preset: str = ""
    """named preset of the family's task config (hard: longer horizons, more distractors, sparser success; docs/fidelity.md); --task_config applies on top; writes its own block, ...-NAME"""
    task_config: str = ""
    """comma list field=value overriding the family's task config"""
    seeds: int = 15
    """seeds per row in the final table (seeds 0..n-1)"""
    train: LabTrainSettings = train_section("num_iterations", num_iterations=100)
    rollout: RolloutSettings = rollout_section("batch_size", "n_samples_per_prompt", batch_size=16,
                                               n_samples_per_prompt=8)
    lr: float = number(10.0, "> 0")
    """learning rate of every row when there is no sweep"""
    lr_sweep: str = ""
    """comma list of learning rates; each row runs at its best"""
    sweep_seeds: int = 5
    """seeds per (row, lr) of the sweep (seeds 1000+)"""
    stable_range: bool = True
    """with --lr_sweep, also run the final seeds at every other rate of the grid (no probes) and print each row's stable rates (no final seed collapsed); costs the final phase again per extra rate"""
    target: float = number(0.8, "(0, 1]")
    """success rate whose first crossing is reported"""
    estimators: str = ",".join(DEFAULT_ESTIMATORS)
    """comma list of rows: named variants, 'ESTIMATOR field=value ...' specs, or 'oracle' (the exact advantage of the learner's own policy, normalised: a reference for what credit assignment can buy)"""
    reference: str = "gigpo"
    """row of the restricted-mean ratio column ('' = none)"""
    probe_every: int = 5
    """on-policy fidelity every k iterations (0 = off)"""
    fixed_fidelity_batches: int = 20
    """batches of the fixed-policy fidelity table on the same tasks (0 = skip)"""
    sign_threshold: float = number(0.1, ">= 0")
    """|A*| above which a step counts for sign"""
    encoder: Literal["auto", "minilm", "none"] = "auto"
    """ProGPO's semantic expansion encoder (auto: minilm if fixed, none if fresh)"""
    task_seed: int = 1
    """seed of the task draw"""
    workers: int = min(2, os.cpu_count() or 1)
    """processes (1 = in-process)"""
    out: str = "runs/bench/learning"
    """output folder of the report, runs and PNGs"""
    write_docs: bool = False
    """replace the generated block of docs/fidelity-results.md"""

    def __post_init__(self) -> None:
        check_counts(self, {"seeds": 1, "workers": 1, "sweep_seeds": 1, "pool": 0, "probe_every": 0,
                            "fixed_fidelity_batches": 0, "task_seed": 0})
        check_fields(self, lambda name: f"--{name}")
        parse_lr_grid(self.lr_sweep)
        lab_task_config(self.family, self.task_preset, self.task_config)
        parse_rows(self.estimators)
        check_reference(self.reference)
        if self.write_docs and self.quick:
            raise ValueError("--write_docs: a --quick run's tiny settings are not written into the docs; drop one")
        check_writable(self.out, "--out")


def check_reference(name: str) -> None:
    """Refuse a ``--reference`` that names no row at all (a typo; '' = none). A real row that ``--estimators``
    leaves out still means no ratio column.

    Raises:
        ValueError: naming ``--reference``.
    """
    if not name:
        return
    try:
        parse_rows(name)
    except ValueError as exc:
        raise ValueError(f"--reference: {exc}".replace("--reference: --estimators: ", "--reference: ")) from None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The flags (:class:`LearningArgs`) as the run reads them: ``iterations``, ``tasks``, ``rollouts`` (the run
    shape), ``lrs`` and ``rows`` parsed, ``auto`` resolved, ``--quick``'s sizes and the pool applied.

    Raises:
        ValueError: naming the flag (:class:`LearningArgs`'s checks, or a malformed ``--estimators``).
    """
    settings = lab_settings.parse(LearningArgs, argv, "python -m research learning", __doc__.split("\n\n")[0])
    args = lab_settings.flat(settings, iterations="train.num_iterations", tasks="rollout.batch_size",
                             rollouts="rollout.n_samples_per_prompt")
    args.lrs = parse_lr_grid(args.lr_sweep)
    args.rows = parse_rows(args.estimators)
    if args.policy == "auto":
        args.policy = "tabular" if args.regime == "fixed" else "features"
    if args.encoder == "auto":
        args.encoder = "minilm" if args.regime == "fixed" else "none"
    if args.quick:
        args.seeds, args.iterations, args.tasks, args.rollouts = 2, 4, 3, 4
        args.sweep_seeds, args.lrs, args.probe_every, args.fixed_fidelity_batches = 1, args.lrs[:2], 2, 2
    if args.pool == 0:
        args.pool = args.iterations * args.tasks
    return args


def parse_lr_grid(text: str) -> list[float]:
    """The learning rates of ``--lr_sweep`` (comma list; empty = no sweep).

    Raises:
        ValueError: naming ``--lr_sweep``: an entry that is not a number, or a rate that is not > 0.
    """
    try:
        lrs = [float(x) for x in comma_list(text, "--lr_sweep")]
    except ValueError as exc:
        raise ValueError(exc if str(exc).startswith("--lr_sweep") else
                         f"--lr_sweep must be a comma list of numbers, got {text!r}") from None
    if any(not (x > 0 and math.isfinite(x)) for x in lrs):
        raise ValueError(f"--lr_sweep rates must be finite numbers > 0, got {text!r}")
    return lrs


def parse_rows(spec: str) -> list:
    """The rows of ``--estimators`` (comma list; duplicates dropped, order kept): ``oracle`` or what
    :func:`research.fidelity_core.select_variants` takes.

    Raises:
        ValueError: naming the row that is neither (and that ``oracle`` is also a row here).
    """
    rows = []
    for name in dict.fromkeys(comma_list(spec, "--estimators")):
        if name == ORACLE_ROW:
            rows.append(oracle_variant())
            continue
        try:
            rows.append(select_variants([name])[0])
        except ValueError as exc:
            raise ValueError(f"--estimators: {exc}; or '{ORACLE_ROW}' (the exact advantage)") from None
    if not rows:
        raise ValueError(f"--estimators must name at least one row, got {spec!r}")
    return rows


def _encoder(args, source) -> tuple[CachedEncoder | None, str]:
    if args.encoder == "none":
        return None, "encoder: none (semantic expansion off)"
    from progpo.advantages.embeddings import default_encoder

    enc = CachedEncoder(default_encoder())
    texts = list(dict.fromkeys(t for ct in source.tasks for t in ct.obs_text[ct.node_obs]))
    enc.warm(texts)
    return enc, f"encoder: all-MiniLM-L6-v2, {len(texts)} observation texts embedded once in {enc.seconds:.0f} s"


def _phase(ctx, rows, lrs: dict[str, list[float]], seeds, args, probe_every: int,
           matched_on: str | None = None) -> dict[str, dict[float, list]]:
    """Run every (row, lr, seed); returns row -> lr -> results (seed order). The runs of row
    ``matched_on`` also probe every row's advantages on their batches (matched-policy fidelity)."""
    specs = [RunSpec(row, lr, s, args.iterations, args.rollouts, probe_every, args.sign_threshold,
                     tuple(rows) if row.name == matched_on and probe_every else ())
             for row in rows for lr in lrs[row.name] for s in seeds]
    out: dict[str, dict[float, list]] = {row.name: {} for row in rows}
    for res in run_all(ctx, specs, args.workers):
        out[res.spec.row.name].setdefault(res.spec.lr, []).append(res)
    return out


def lab_task_config(family_name: str, preset: str = "", overrides: str = ""):
    """The ``learn``-split task config of family ``family_name`` with ``--task_preset`` ``preset`` (``""``: none)
    and the ``--task_config`` comma list ``overrides`` (``field=value``) applied on top, as every lab command
    that draws tasks reads them.

    Raises:
        ValueError: naming the flag: an unknown family, a preset the family does not have (the message lists its
            presets), a malformed override or an unknown field.
    """
    family = get_family(family_name)
    if preset and preset not in family.presets:
        raise ValueError(f"--task_preset: family {family_name} has no preset {preset!r}; presets: {sorted(family.presets)}")
    try:
        return family_config(family, "learn", comma_list(overrides, "--task_config"), preset)
    except ValueError as exc:
        raise ValueError(exc if str(exc).startswith("--") else f"--task_config: {exc}") from None


def _cost(label: str, results: list, wall: float) -> str:
    cpu = sum(r.cpu_s for r in results)
    return (f"{label}: {len(results)} runs, {wall:.0f} s wall, {cpu:.0f} s CPU in the runs "
            f"({cpu / max(len(results), 1):.1f} s per run)")


def run(args: argparse.Namespace) -> str:
    """Sweep (optional), final runs, tables; returns the markdown report (and writes the PNG)."""
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    family = get_family(args.family)
    cfg = lab_task_config(args.family, args.task_preset, args.task_config)
    rows = args.rows
    names = [r.name for r in rows]
    estimators = [r.name for r in rows if not r.exact]  # the rows with something to measure (no oracle)
    reference = args.reference if args.reference in names else None
    source = build_source(family, cfg, args.regime, args.policy, args.tasks, args.task_seed, args.pool, args.workers)
    build_s = time.perf_counter() - t0
    encoder, enc_line = _encoder(args, source) if any(r.needs_encoder for r in rows) else (None, "encoder: not needed")
    ctx = make_context(source, encoder)
    costs, parts = [f"setup (tasks compiled, encoder) {time.perf_counter() - t0:.0f} s wall "
                    f"(task compilation {build_s:.0f} s)"], []
    best, sweep_line = _sweep(ctx, rows, args, costs, parts)
    t1 = time.perf_counter()
    final_by = _phase(ctx, rows, {n: [best[n]] for n in names}, range(args.seeds), args, args.probe_every,
                      reference)
    final = {n: final_by[n][best[n]] for n in names}
    args.results["final"] = final
    costs.append(_cost("final runs", [r for runs in final.values() for r in runs], time.perf_counter() - t1))
    oracle = next((r.name for r in rows if r.exact), None)
    tau = lr_report.common_tau(list(final.values()), args.target)
    parts.append(f"**Learning** ({args.seeds} seeds per row, seeds 0..{args.seeds - 1}; {sweep_line}; collapsed: "
                 f"{COLLAPSE_RULE})\n\n"
                 + lr_report.main_table(final, best, args.target, tau, reference, oracle))
    if args.lrs and args.stable_range:
        t1 = time.perf_counter()
        others = _phase(ctx, rows, {n: [lr for lr in args.lrs if lr != best[n]] for n in names}, range(args.seeds),
                        args, 0)
        grid = {n: dict(sorted({**others[n], best[n]: final[n]}.items())) for n in names}
        args.results["final_grid"] = grid
        costs.append(_cost("final seeds at the other rates", [r for by in others.values() for rs in by.values()
                                                              for r in rs], time.perf_counter() - t1))
        parts.append(f"**Stability over the learning-rate grid** (the {args.seeds} final seeds at every rate; cell: "
                     f"collapsed seeds, final success; stable rates: no final seed collapsed; bold: the rate used "
                     f"above)\n\n" + lr_report.stability_table(grid, best))
    if args.probe_every:
        parts.append(f"**On-policy fidelity** (against the exact advantage of the learner's own current policy, "
                     f"every {args.probe_every} iterations of the final runs; mean over probes, then mean ± 95% "
                     f"interval over seeds; early / late = first / last third of training)\n\n"
                     + lr_report.onpolicy_table(final))
        if reference:
            parts.append(f"**Matched-policy fidelity** (every row's advantages on the batches of the {reference} "
                         f"runs above, against the exact advantage of that policy: all rows judged on the same "
                         f"policies)\n\n" + lr_report.matched_table(final[reference], estimators))
    fixed = None
    if args.fixed_fidelity_batches:
        t1 = time.perf_counter()
        tasks = make_tasks(family, cfg, args.tasks, args.task_seed)
        fixed = lr_report.fixed_policy_fidelity(tasks, rows, ctx.base, args.fixed_fidelity_batches, args.rollouts,
                                                encoder, args.sign_threshold, 0)
        costs.append(f"fixed-policy fidelity: {time.perf_counter() - t1:.0f} s wall")
        parts.append(f"**Fixed-policy fidelity** (the same rows against the exact advantage of the family's "
                     f"fixed behaviour policy on the first {args.tasks} tasks, {args.fixed_fidelity_batches} batches "
                     f"of {args.tasks} x {args.rollouts})\n\n" + lr_report.fixed_policy_table(fixed))
    if args.probe_every:
        parts.append("**Which fidelity predicts learning** (Spearman rank correlation across the rows above)\n\n"
                     + lr_report.predictiveness_table({n: final[n] for n in estimators}, fixed,
                                                      args.target, tau,
                                                      final[reference] if reference else None))
    png = report.plot_curves({n: [(r.steps, r.success) for r in runs] for n, runs in final.items()},
                             Path(args.out) / f"{_block(args)}.png",
                             f"{args.family} ({args.regime} tasks), {args.tasks} tasks x {args.rollouts}, "
                             f"{args.seeds} seeds, best lr each")
    head = lr_report.headroom_line(final, args.target, reference, oracle) + "\n\n" + _head(args, cfg, enc_line)
    load1 = os.getloadavg()[0]
    cost = ("Cost: " + "; ".join(costs) + f"; total {time.perf_counter() - t0:.0f} s wall; load average "
            f"{load0:.1f} at start, {load1:.1f} at end ({os.cpu_count()} CPUs, {args.workers} workers); "
            f"figure: {png.name}.")
    return "\n\n".join([head, *parts, cost])


def _sweep(ctx, rows, args, costs: list[str], parts: list[str]) -> tuple[dict[str, float], str]:
    """The learning-rate sweep (when ``--lr_sweep`` is given): (best lr per row, a line saying how lrs were
    chosen); appends its table to ``parts``, its cost to ``costs``, its runs to ``args.results``."""
    names = [r.name for r in rows]
    args.results = {"sweep": {}}
    if not args.lrs:
        return {n: args.lr for n in names}, f"lr {args.lr:g} for every row (no sweep)"
    t1 = time.perf_counter()
    sweep = _phase(ctx, rows, {n: args.lrs for n in names}, range(SWEEP_SEED0, SWEEP_SEED0 + args.sweep_seeds),
                   args, 0)
    args.results["sweep"] = sweep
    flat = [r for by in sweep.values() for runs in by.values() for r in runs]
    costs.append(_cost("lr sweep", flat, time.perf_counter() - t1))
    tau_s = lr_report.common_tau([flat], args.target)
    best = {n: lr_report.pick_lr(sweep[n], args.target, tau_s) for n in names}
    parts.append(f"**Learning-rate sweep** ({args.sweep_seeds} seeds per cell, seeds {SWEEP_SEED0}+; cell: "
                 f"restricted mean env steps to {args.target:.0%} at tau {tau_s / 1e3:,.0f}k (seeds reaching), "
                 f"final success, collapsed seeds if any; bold: the rate each row uses below: the fewest collapsed "
                 f"seeds, then the fastest)\n\n"
                 + lr_report.sweep_table(sweep, args.target, tau_s, best))
    return best, f"each row at its best lr of {args.lr_sweep} (sweep above)"


def _head(args: argparse.Namespace, cfg, enc_line: str) -> str:
    preset = f", preset **{args.task_preset}**" if args.task_preset else ""
    return (f"Family **{args.family}**{preset} ({cfg}), **{args.regime}** tasks ("
            + (f"the same {args.tasks} tasks every iteration" if args.regime == "fixed" else
               f"{args.tasks} new tasks per iteration from a pool of {args.pool}")
            + f"), {args.policy} policy, {args.rollouts} rollouts per task, {args.iterations} iterations; {enc_line}. "
            "Success = share of the iteration's training episodes that succeeded (final: last 5 iterations, mean "
            "± 95% t-interval over seeds); steps to X = env steps when the 3-iteration moving average first "
            "reaches X; seeds that never do are censored at their budget (KM median with 95% interval; "
            "restricted mean = mean of min(steps, tau), tau = smallest budget of a final run that never reached X, or the latest crossing when all did).")


def _block(args: argparse.Namespace) -> str:
    """Name of the docs block (and of the output files): one per family, regime, task preset and task draw."""
    name = "learning" if (args.family, args.regime) == ("alfworld", "fixed") else f"learning-{args.family}-{args.regime}"
    if args.task_preset:
        name += f"-{args.task_preset}"
    if args.task_seed != 1:  # the developers' draw keeps the names the docs have always used
        name += f"-task{args.task_seed}"
    return name + ("-quick" if args.quick else "")


def main(argv: Sequence[str]) -> int:
    """Entry point of ``python -m research learning``; prints the markdown report."""
    try:
        args = parse_args(argv)
    except ValueError as exc:  # a bad flag or row: one line naming it, nothing run or written
        print(f"python -m research learning: error: {exc}", file=sys.stderr)
        return 2
    text = run(args)
    cmd = ("python -m research learning " + shlex.join(argv)).strip()
    print(text)
    report.save_report(args.out, _block(args), cmd, text, args.results, write_docs=args.write_docs)
    return 0
