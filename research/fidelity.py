"""``python -m research fidelity``: how close each estimator's step advantages are to the truth.

Synthetic ALFWorld-like text MDPs (``progpo.envs.synthetic.alfworld_like``) with a fixed history-dependent
behaviour policy give the exact ``A*(h_t, a_t) = Q - V`` by dynamic programming
(``research.oracle``). Batches are sampled like training batches (16 tasks x N rollouts), every
estimator and ProGPO ablation runs on them, and the table reports per estimator the sign agreement,
Spearman and Pearson correlation and normalised MSE with the truth (mean and 95% t-interval over
batches), plus the batches' exact-prefix fragmentation. A sweep over generator settings shows where
each estimator wins. ``--mode alfworld`` measures the same on real ALFWorld games
(``research.fidelity_alfworld``; opt-in, slow). See docs/fidelity.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from research import report
from research.fidelity_core import (
    CORE_VARIANTS,
    METRICS,
    CachedEncoder,
    config_base,
    mean_ci,
    peer_fragmentation,
    run_variants,
    sample_truth_batch,
    select_variants,
)
from research.oracle import ExactOracle
from progpo.envs.spec import spec
from progpo.envs.synthetic.families import get_family, make_tasks
from progpo.bounds import check_fields, number
from progpo.run.flags import check_writable, comma_list
from progpo.run.settings import EnvSettings, RolloutSettings
from research import settings as lab_settings
from research.settings import LabTrainSettings, check_counts, rollout_section, train_section

ORACLE_ROW = "TD oracle (true V)"

#: fragmentation sweep of the ALFWorld-like family (``progpo.envs.synthetic.families.AlfworldFamily.sweep``).
SWEEP: dict[str, dict[str, object]] = get_family("alfworld").sweep


@dataclass
class Setting:
    """Tasks and their oracles for one MDP configuration."""

    name: str
    cfg: object  #: the family's task config (MDPConfig, ShopConfig, ...)
    tasks: list
    oracles: list[ExactOracle]
    build_s: float


def build_setting(name: str, cfg, n_tasks: int, seed: int, family: str = "alfworld") -> Setting:
    """Generate ``n_tasks`` tasks of ``family`` with config ``cfg`` and solve each exactly (timed)."""
    t0 = time.perf_counter()
    tasks = make_tasks(get_family(family), cfg, n_tasks, seed)
    oracles = [ExactOracle(t) for t in tasks]
    return Setting(name, cfg, tasks, oracles, time.perf_counter() - t0)


def observation_vocab(setting: Setting) -> list[str]:
    """Every observation text the setting's tasks can emit (the finite vocabulary to embed once)."""
    texts: dict[str, None] = {}
    for orc in setting.oracles:
        texts.update(dict.fromkeys(orc.out_obs))
        texts.update(dict.fromkeys(n[1] for n in orc.nodes))
    return list(texts)


def evaluate(setting: Setting, variants, n_rollouts: int, n_batches: int, tasks_per_batch: int, encoder,
             sign_threshold: float, seed: int) -> dict:
    """Run ``n_batches`` batches; returns per-row metric lists, fragmentation, timings and batch stats."""
    rng = np.random.default_rng([seed, n_rollouts, 17])
    base = config_base(setting.cfg.horizon, setting.cfg.gamma, setting.cfg.success_reward)
    per_row: dict[str, dict[str, list[float]]] = {}
    frag: dict[str, list[float]] = {}
    timings: dict[str, float] = {}
    steps, success = [], []
    for _ in range(n_batches):
        pick = rng.choice(len(setting.tasks), size=min(tasks_per_batch, len(setting.tasks)), replace=False)
        tb = sample_truth_batch([setting.tasks[i] for i in pick], [setting.oracles[i] for i in pick], n_rollouts, rng)
        for k, v in peer_fragmentation(tb.batch).items():
            frag.setdefault(k, []).append(v)
        steps.append(tb.batch.num_steps)
        success.append(float(tb.success.mean()))
        for row, metrics in run_variants(tb, variants, base, encoder, sign_threshold, timings).items():
            for m, val in metrics.items():
                per_row.setdefault(row, {}).setdefault(m, []).append(val)
    return {"rows": per_row, "frag": frag, "ms": {k: 1e3 * v / n_batches for k, v in timings.items()},
            "steps": float(np.mean(steps)), "success": float(np.mean(success)), "n_batches": n_batches}


def main_table(res: dict, n_rollouts: int, tasks_per_batch: int) -> str:
    """Markdown table of one N: every row with mean +- 95% half-width of each metric."""
    fr = {k: mean_ci(v)[0] for k, v in res["frag"].items()}
    head = (f"**N = {n_rollouts}** ({tasks_per_batch} tasks x {n_rollouts} rollouts, {res['n_batches']} batches, "
            f"{res['steps']:.0f} steps/batch, behaviour success {res['success']:.2f}; exact-prefix groups with >= 2 "
            f"members: {fr['frac_peer_ge2']:.3f} of steps, {fr['frac_peer_ge2_t>0']:.3f} at t > 0)\n\n")
    header = ["estimator", "sign agree", "Spearman", "Pearson", "NMSE", "ms/batch"]
    rows = []
    for name, metrics in res["rows"].items():
        cells = [name] + [report.fmt_ci(*mean_ci(metrics[m])) for m in METRICS]
        cells.append("-" if name == ORACLE_ROW else f"{res['ms'].get(name, float('nan')):.0f}")
        rows.append(cells)
    return head + report.markdown_table(header, rows)


def sweep_table(results: dict[str, dict], names: Sequence[str]) -> str:
    """Markdown table: per setting, fragmentation and each row's Spearman; the best non-oracle row."""
    header = ["setting", "peer>=2 (t>0)", "success", *names, "best (Spearman)"]
    rows = []
    for setting, res in results.items():
        fr = mean_ci(res["frag"]["frac_peer_ge2_t>0"])[0]
        means = {n: mean_ci(res["rows"][n]["spearman"]) for n in names}
        cands = {n: m for n, m in means.items() if n != ORACLE_ROW}
        best = max(cands, key=lambda n: cands[n][0])
        tied = [n for n, (m, h) in cands.items() if n != best and m + h >= cands[best][0] - cands[best][1]]
        best_txt = best + (f" (CI overlaps {len(tied)} others)" if tied else "")
        rows.append([setting, f"{fr:.3f}", f"{res['success']:.2f}", *[report.fmt_ci(*means[n]) for n in names],
                     best_txt])
    return report.markdown_table(header, rows)


@dataclass(frozen=True)
class FidelityArgs:
    """The flags of ``python -m research fidelity``; ``--mode alfworld`` reads the ALFWorld ones
    (:mod:`research.fidelity_alfworld`: opt-in, every truth estimate replays the game from reset)."""

    mode: Literal["synthetic", "alfworld"] = "synthetic"
    """synthetic MDPs with exact DP truth, or real ALFWorld games (slow, opt-in)"""
    quick: bool = False
    """tiny settings for CI (< 2 min)"""
    family: str = "alfworld"
    """synthetic task family: alfworld | webshop"""
    batches: int = 50
    """batches per N"""
    n_rollouts: str = "4,8,16"
    """comma list of N (rollouts per task) compared side by side"""
    rollout: RolloutSettings = rollout_section("batch_size", "n_samples_per_prompt", batch_size=16,
                                               n_samples_per_prompt=4)
    task_pool: int = 32
    """distinct tasks per setting (batches draw from them)"""
    sweep_batches: int = 30
    """batches per sweep setting (0 = no sweep)"""
    sweep_n: int = 8
    """N of the sweep"""
    estimators: str | None = None
    """comma list of rows (None: all)"""
    encoder: Literal["minilm", "none"] = "minilm"
    """semantic-expansion encoder: the real all-MiniLM-L6-v2 or none (expansion off)"""
    sign_threshold: float = number(0.1, ">= 0")
    """|A*| (reward units) above which a step counts for sign agreement"""
    train: LabTrainSettings = train_section("seed", seed=0)
    out: str = "runs/bench/fidelity"
    """output folder for PNGs and tables"""
    write_docs: bool = False
    """replace the generated block of docs/fidelity-results.md"""
    games: str = "0"
    """--mode alfworld: comma list of game indices of --split"""
    split: str = field(default="valid_seen", metadata={"choices": lambda: spec("alfworld").splits})
    """--mode alfworld: ALFWorld split of --games"""
    p_expert: float = number(0.8, "[0, 1]")
    """--mode alfworld: probability of the walkthrough action"""
    continuations: int = 4
    """--mode alfworld: M rollouts per V(h) estimate"""
    env: EnvSettings = field(default_factory=lambda: EnvSettings(name="alfworld", max_steps=12, history_length=2),
                             metadata={"flags": ("max_steps", "history_length")})

    def __post_init__(self) -> None:
        check_counts(self, {"batches": 1, "task_pool": 1, "sweep_n": 1, "sweep_batches": 0, "continuations": 1})
        if self.env.max_steps is None:
            raise ValueError("--env.max_steps must be >= 1, got None")
        check_fields(self, lambda name: f"--{name}")
        n_list(self.n_rollouts)
        estimator_names(self.estimators)
        try:
            get_family(self.family)
        except ValueError as exc:
            raise ValueError(f"--family: {exc}") from None
        if self.mode == "alfworld":
            game_list(self.games)
        if self.write_docs and self.quick:
            raise ValueError("--write_docs: a --quick run's tiny settings are not written into the docs; drop one")
        check_writable(self.out, "--out")


def estimator_names(text: str | None) -> list[str] | None:
    """The rows of ``--estimators`` (None: all), each checked (:func:`select_variants`).

    Raises:
        ValueError: naming ``--estimators``: an empty list or entry, or a row that is neither a named variant nor
            a row spec.
    """
    if text is None:
        return None
    names = comma_list(text, "--estimators")
    if not names:
        raise ValueError(f"--estimators must name at least one row (none: all), got {text!r}")
    try:
        select_variants(names)
    except ValueError as exc:
        raise ValueError(f"--estimators: {exc}") from None
    return names


def int_list(text: str, flag: str, minimum: int, what: str) -> list[int]:
    """The ints of the comma list ``text`` of ``flag``, each ``>= minimum`` (``what``: their name in the error).

    Raises:
        ValueError: naming ``flag``.
    """
    try:
        values = [int(x) for x in comma_list(text, flag)]
    except ValueError as exc:
        raise ValueError(exc if str(exc).startswith(flag) else
                         f"{flag} must be a comma list of {what}, got {text!r}") from None
    if not values or min(values) < minimum:
        raise ValueError(f"{flag} must list {what} >= {minimum}, got {text!r}")
    return values


def game_list(text: str) -> list[int]:
    """The game indices of ``--games`` (comma list of ints >= 0). Raises: ValueError naming ``--games``."""
    return int_list(text, "--games", 0, "game indices")


def n_list(text: str) -> list[int]:
    """The group sizes of ``--n_rollouts`` (comma list of ints >= 1). Raises: ValueError naming ``--n_rollouts``."""
    return int_list(text, "--n_rollouts", 1, "ints")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The flags (:class:`FidelityArgs`) as the run reads them: ``n_list``, ``tasks_per_batch``, ``seed`` and the
    ALFWorld mode's ``alf_rollouts``, ``alf_max_steps``, ``alf_history``; ``--quick``'s sizes applied."""
    settings = lab_settings.parse(FidelityArgs, argv, "python -m research fidelity", __doc__.split("\n\n")[0])
    args = lab_settings.flat(settings, tasks_per_batch="rollout.batch_size", seed="train.seed",
                             alf_rollouts="rollout.n_samples_per_prompt", alf_max_steps="env.max_steps",
                             alf_history="env.history_length")
    args.n_list = n_list(args.n_rollouts)
    if args.quick:
        args.batches, args.n_list, args.tasks_per_batch, args.task_pool = 3, [4], 4, 6
        args.sweep_batches, args.sweep_n = min(args.sweep_batches, 2), 4
    return args


def _encoder(kind: str) -> tuple[CachedEncoder | None, float]:
    if kind == "none":
        return None, 0.0
    from progpo.advantages.embeddings import default_encoder
    t0 = time.perf_counter()
    enc = CachedEncoder(default_encoder())
    return enc, time.perf_counter() - t0


def run_synthetic(args: argparse.Namespace) -> str:
    """The synthetic benchmark: main tables per N, the sweep, PNGs; returns the markdown report."""
    t_start, c_start = time.perf_counter(), time.process_time()
    variants = select_variants(estimator_names(args.estimators))
    family = get_family(args.family)
    base_cfg = family.fidelity_cfg
    if args.quick:
        base_cfg = replace(base_cfg, **family.quick_overrides)
    sweep = {"base (quick)": {}, "1 wording": {"n_variants": 1}} if args.quick else family.sweep
    encoder, load_s = _encoder(args.encoder)
    main = build_setting("base", base_cfg, args.task_pool, args.seed, args.family)
    embed_line = "encoder: none (semantic expansion off)"
    if encoder is not None:
        vocab = observation_vocab(main)
        encoder.warm(vocab)
        embed_line = (f"encoder: all-MiniLM-L6-v2 on CPU, load {load_s:.1f} s, {len(vocab)} observation texts "
                      f"embedded once in {encoder.seconds:.1f} s")
    parts = [f"Synthetic MDP ({args.family} family): {base_cfg}\n", f"{len(main.tasks)} tasks solved exactly in {main.build_s:.1f} s "
             f"({np.mean([o.num_nodes for o in main.oracles]):.0f} nodes/task); {embed_line}.\n"]
    results = {}
    for n in args.n_list:
        results[n] = evaluate(main, variants, n, args.batches, args.tasks_per_batch, encoder, args.sign_threshold,
                              args.seed)
        parts.append(main_table(results[n], n, args.tasks_per_batch))
    sweep_res = {}
    if args.sweep_batches > 0:
        core = [v for v in variants if v.name in CORE_VARIANTS] or variants
        for name, over in sweep.items():
            st = main if not over else build_setting(name, replace(base_cfg, **over), args.task_pool, args.seed,
                                                             args.family)
            if encoder is not None:
                encoder.warm(observation_vocab(st))
            sweep_res[name] = evaluate(st, core, args.sweep_n, args.sweep_batches, args.tasks_per_batch, encoder,
                                       args.sign_threshold, args.seed + 1)
        names = [v.name for v in core] + [ORACLE_ROW]
        parts.append(f"**Fragmentation sweep** (Spearman with A*, N = {args.sweep_n}, {args.sweep_batches} batches "
                     f"per setting)\n\n" + sweep_table(sweep_res, names))
    out = Path(args.out)
    pngs = report.plot_fidelity(results, sweep_res, out, "fidelity" if args.family == "alfworld" else f"fidelity_{args.family}")
    parts.append(f"Total wall time {time.perf_counter() - t_start:.0f} s, CPU time {time.process_time() - c_start:.0f} s (this process; the"
                 f" encoder's calls took {0 if encoder is None else encoder.seconds:.0f} s wall); figures: {', '.join(p.name for p in pngs)}.")
    return "\n\n".join(parts)


def main(argv: Sequence[str]) -> int:
    """Entry point of ``python -m research fidelity``; prints the markdown report (exit 2 with one line on a bad
    flag)."""
    try:
        args = parse_args(argv)
    except ValueError as exc:
        print(f"python -m research fidelity: error: {exc}", file=sys.stderr)
        return 2
    if args.mode == "alfworld":
        from research.fidelity_alfworld import run_alfworld
        text = run_alfworld(args)
        block = "fidelity-alfworld"
    else:
        text = run_synthetic(args)
        block = "fidelity" if args.family == "alfworld" else f"fidelity-{args.family}"
        block += "-quick" if args.quick else ""
    cmd = "python -m research fidelity " + shlex.join(argv)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{block}.md").write_text(f"`{cmd.strip()}`\n\n{text}\n")
    if args.write_docs:
        report.write_docs_block(block, cmd.strip(), text)
    return 0
