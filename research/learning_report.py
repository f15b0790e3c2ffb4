"""Tables of the learning benchmark: learning-rate sweep, censored learning statistics, on-policy and
fixed-policy fidelity, and how well each fidelity measure predicts learning (markdown)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from progpo.bounds import number
from research import report
from research.fidelity_core import mean_ci, run_variants, sample_truth_batch
from research.learner import RunResult
from research.oracle import ExactOracle
from research.survival import (FINAL_WINDOW, Censored, collapse, fmt_steps, gap_share, km_median, rmst, rmst_ratio,
                                 steps_to_target)


def censored(runs: Sequence[RunResult], target: float) -> Censored:
    """Steps-to-``target`` of each run, censored at the run's total env steps."""
    return Censored.of([steps_to_target(r.steps, r.success, target) for r in runs], [r.steps[-1] for r in runs])


def final_success(runs: Sequence[RunResult]) -> list[float]:
    """Per run, the mean batch success of the last :data:`FINAL_WINDOW` iterations."""
    return [float(np.mean(r.success[-FINAL_WINDOW:])) for r in runs]


def collapsed_seeds(runs: Sequence[RunResult]) -> list[int]:
    """The seeds (``spec.seed``) of ``runs`` that collapsed (:func:`research.survival.collapse`)."""
    return [runs[i].spec.seed for i in collapse([r.success for r in runs]).seeds]


def fmt_collapsed(runs: Sequence[RunResult]) -> str:
    """``0/15`` or ``2/15 (seeds 5, 10)``: the collapsed seeds of ``runs``."""
    seeds = collapsed_seeds(runs)
    listed = f" (seeds {', '.join(str(s) for s in seeds)})" if seeds else ""
    return f"{len(seeds)}/{len(runs)}{listed}"


def common_tau(groups: Sequence[Sequence[RunResult]], target: float) -> float:
    """The restricted-mean horizon of every run compared: the smallest total env steps of a run that never
    reached ``target`` (it is observed only up to its budget); when every run reached it, the latest
    crossing (no run is capped). A run that reached ``target`` early and then stopped with a small budget
    (a fast learner's short episodes) does not shorten the horizon of the others."""
    runs = [r for g in groups for r in g]
    c = censored(runs, target)
    return float(c.budgets[~c.reached].min() if np.any(~c.reached) else c.times.max())


def pick_lr(by_lr: dict[float, list[RunResult]], target: float, tau: float) -> float:
    """The learning rate with the fewest collapsed seeds (:func:`collapsed_seeds`), then the smallest
    restricted mean steps to ``target``, then the higher final success: a rate at which a seed collapsed
    is chosen only when every rate has a collapse."""
    return min(by_lr, key=lambda lr: (len(collapsed_seeds(by_lr[lr])), rmst(censored(by_lr[lr], target), tau)[0],
                                      -np.mean(final_success(by_lr[lr]))))


def sweep_table(sweep: dict[str, dict[float, list[RunResult]]], target: float, tau: float,
                best: dict[str, float]) -> str:
    """Rows x learning rates: restricted mean steps to ``target`` (seeds reaching), final success and, where
    any, the collapsed seeds."""
    lrs = sorted({lr for by_lr in sweep.values() for lr in by_lr})
    rows = []
    for name, by_lr in sweep.items():
        cells = [name]
        for lr in lrs:
            runs = by_lr.get(lr)
            if not runs:
                cells.append("-")
                continue
            c = censored(runs, target)
            mark = "**" if best.get(name) == lr else ""
            n_col = len(collapsed_seeds(runs))
            col = f", {n_col}/{len(runs)} collapsed" if n_col else ""
            cells.append(f"{mark}{fmt_steps(rmst(c, tau)[0])} ({int(c.reached.sum())}/{len(runs)}), "
                         f"{np.mean(final_success(runs)):.2f}{col}{mark}")
        rows.append(cells)
    return report.markdown_table(["row", *[f"lr {lr:g}" for lr in lrs]], rows)


def _reached_mean(c: Censored) -> str:
    x = c.times[c.reached]
    if x.size == 0:
        return "n/a"
    m, h = mean_ci(x)
    return f"{m:,.0f} ± {h:,.0f}" if x.size > 1 else f"{m:,.0f}"


def main_table(final: dict[str, list[RunResult]], lrs: dict[str, float], target: float, tau: float,
               reference: str | None, oracle: str | None = None) -> str:
    """Per row: lr, final success, collapsed seeds, steps to 50% and to ``target`` (seeds reaching, mean of
    those that did, Kaplan-Meier median [95%], restricted mean), the restricted-mean ratio to ``reference``
    and, with an ``oracle`` row, the share of the reference-to-oracle gap the row closes (:func:`gap_share`).
    With ``target`` = 0.5 the 50% column is not repeated."""
    half_col = abs(target - 0.5) > 1e-12
    header = ["row", "lr", "final success", "collapsed", *(["KM median to 50% [95%]"] * half_col),
              f"seeds reaching {target:.0%}",
              f"steps to {target:.0%}, reaching seeds", f"KM median to {target:.0%} [95%]",
              f"restricted mean to {target:.0%} (tau {tau / 1e3:,.0f}k)"]
    if reference:
        header.append(f"x {reference} [95%]")
    if reference and oracle:
        header.append(f"share of the {reference}->{oracle} gap closed [95%]")
    ref = censored(final[reference], target) if reference else None
    orc = censored(final[oracle], target) if reference and oracle else None
    rows = []
    for name, runs in final.items():
        half, c = censored(runs, 0.5), censored(runs, target)
        m50, lo50, hi50 = km_median(half)
        med, lo, hi = km_median(c)
        r, h = rmst(c, tau)
        row = [name, f"{lrs[name]:g}", report.fmt_ci(*mean_ci(final_success(runs))), fmt_collapsed(runs),
               *([f"{fmt_steps(m50)} [{fmt_steps(lo50)}, {fmt_steps(hi50)}]"] * half_col),
               f"{int(c.reached.sum())}/{len(runs)}", _reached_mean(c),
               f"{fmt_steps(med)} [{fmt_steps(lo)}, {fmt_steps(hi)}]", f"{r:,.0f} ± {h:,.0f}"]
        if ref is not None:
            q, qlo, qhi = rmst_ratio(c, ref, tau)
            row.append(f"{q:.2f} [{qlo:.2f}, {qhi:.2f}]")
        if orc is not None:
            row.append(_fmt_share(gap_share(c, ref, orc, tau)))
        rows.append(row)
    return report.markdown_table(header, rows)


def headroom_line(final: dict[str, list[RunResult]], target: float, reference: str | None,
                  oracle: str | None) -> str:
    """The line that opens every learning block: the oracle's headroom over ``reference`` (GiGPO), i.e. the
    ratio of restricted mean env steps to ``target`` (oracle / reference, 95% bootstrap interval,
    :func:`research.survival.rmst_ratio`) and the reference's final success (last iterations, mean ± 95%
    t-interval over seeds). Small ratio = the exact advantage buys much, so the block can tell estimators
    apart; near 1 = it cannot. Says so when either row is missing.

    Its horizon ``tau`` is :func:`common_tau` of the two rows' runs alone, not the block's: a horizon both rows
    are observed up to, as two-arm restricted-mean comparisons choose it (Tian et al. 2020 take the smaller of
    the two arms' largest follow-up times; ``common_tau`` is stricter). The headroom is a property of the task
    setting, so a third row whose failing runs end early (a policy that buys at once) must not shorten it.
    The block's tables keep the common ``tau`` of every row."""
    if not (reference and oracle):
        return ("**Oracle headroom**: not measured (it needs the rows `oracle` and the `--reference` row in "
                "`--estimators`).")
    tau = common_tau([final[oracle], final[reference]], target)
    q, lo, hi = rmst_ratio(censored(final[oracle], target), censored(final[reference], target), tau)
    return (f"**Oracle headroom**: {oracle}'s env steps to {target:.0%} / {reference}'s = **{q:.2f} [{lo:.2f}, "
            f"{hi:.2f}]** (restricted means at tau {tau / 1e3:,.0f}k, the two rows' own horizon; 95% bootstrap); "
            f"{reference}'s final success {report.fmt_ci(*mean_ci(final_success(final[reference])))}.")


def _fmt_share(share: tuple[float, float, float]) -> str:
    g, lo, hi = share
    return "n/a (no gap)" if not np.isfinite(g) else f"{g:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def stability_table(by_rate: dict[str, dict[float, list[RunResult]]], best: dict[str, float]) -> str:
    """Rows x learning rates over the final seeds: collapsed seeds and final success per rate, and the
    row's stable rates (the rates of the grid at which no final seed collapsed); bold: the chosen rate."""
    lrs = sorted({lr for by_lr in by_rate.values() for lr in by_lr})
    rows = []
    for name, by_lr in by_rate.items():
        cells, stable = [name], []
        for lr in lrs:
            runs = by_lr.get(lr)
            if not runs:
                cells.append("-")
                continue
            if not collapsed_seeds(runs):
                stable.append(lr)
            mark = "**" if best.get(name) == lr else ""
            cells.append(f"{mark}{fmt_collapsed(runs)}, {np.mean(final_success(runs)):.2f}{mark}")
        cells.append(_fmt_rates(stable, lrs))
        rows.append(cells)
    return report.markdown_table(["row", *[f"lr {lr:g}" for lr in lrs], "stable rates"], rows)


def _fmt_rates(stable: Sequence[float], grid: Sequence[float]) -> str:
    """``1-3`` for a run of consecutive grid rates, ``1, 3`` otherwise, ``none`` when empty."""
    if not stable:
        return "none"
    idx = [list(grid).index(x) for x in stable]
    if idx == list(range(idx[0], idx[-1] + 1)) and len(idx) > 1:
        return f"{stable[0]:g}-{stable[-1]:g}"
    return ", ".join(f"{x:g}" for x in stable)


ONPOLICY_COLS = (("spearman", "Spearman"), ("sign", "sign agree"), ("nmse", "NMSE"), ("cosine", "update cosine"),
                 ("spearman_zero", "Spearman, zero-signal tasks"), ("cosine_zero", "update cosine, zero-signal"),
                 ("abs_adv_zero", "mean abs A / std A, zero-signal"), ("zero_share", "zero-signal share"))


def onpolicy_summary(runs: Sequence[RunResult], metric: str, phase: str = "all") -> tuple[float, float]:
    """Mean over seeds (95% t half-width) of a probe metric averaged over a phase of each run's probes:
    ``all``, ``early`` (first third of the iterations), ``late`` (last third)."""
    per_seed = []
    for r in runs:
        it, v = r.probe_it, r.probes[metric]
        if it.size == 0:
            continue
        n = r.steps.size
        keep = {"all": np.ones(it.size, bool), "early": it < n / 3, "late": it >= 2 * n / 3}[phase]
        vals = v[keep & np.isfinite(v)]
        if vals.size:
            per_seed.append(float(vals.mean()))
    return mean_ci(per_seed)


def onpolicy_table(final: dict[str, list[RunResult]]) -> str:
    """Per row: each on-policy fidelity metric (all probes), plus Spearman early / late."""
    header = ["row", "Spearman early", "Spearman late", *[label for _, label in ONPOLICY_COLS]]
    rows = []
    for name, runs in final.items():
        cells = [name, report.fmt_ci(*onpolicy_summary(runs, "spearman", "early")),
                 report.fmt_ci(*onpolicy_summary(runs, "spearman", "late"))]
        cells += [report.fmt_ci(*onpolicy_summary(runs, m)) for m, _ in ONPOLICY_COLS]
        rows.append(cells)
    return report.markdown_table(header, rows)


def matched_summary(ref_runs: Sequence[RunResult], row: str, metric: str) -> tuple[float, float]:
    """Mean over seeds (95% half-width) of ``row``'s probe ``metric`` on the reference runs' batches."""
    per_seed = []
    for r in ref_runs:
        v = r.matched.get(row, {}).get(metric)
        if v is not None and np.isfinite(v).any():
            per_seed.append(float(np.nanmean(v)))
    return mean_ci(per_seed)


def matched_table(ref_runs: Sequence[RunResult], names: Sequence[str]) -> str:
    """Per row: on-policy metrics of its advantages on the reference runs' batches (same policies for all)."""
    cols = [c for c in ONPOLICY_COLS if c[0] != "zero_share"]
    rows = [[n, *[report.fmt_ci(*matched_summary(ref_runs, n, m)) for m, _ in cols]] for n in names]
    return report.markdown_table(["row", *[label for _, label in cols]], rows)


def fixed_policy_fidelity(tasks, rows, base: dict, batches: int, rollouts: int, encoder, sign_threshold: float,
                          seed: int) -> dict[str, dict[str, list[float]]]:
    """Fidelity of each row against the exact advantage of the family's fixed behaviour policy
    (:mod:`research.fidelity`'s measurement) on ``tasks``: row -> metric -> per-batch values."""
    oracles = [ExactOracle(t) for t in tasks]
    rng = np.random.default_rng([seed, rollouts, 17])
    out: dict[str, dict[str, list[float]]] = {}
    for _ in range(batches):
        tb = sample_truth_batch(tasks, oracles, rollouts, rng)
        for name, metrics in run_variants(tb, rows, base, encoder, sign_threshold, {}).items():
            for m, v in metrics.items():
                out.setdefault(name, {}).setdefault(m, []).append(v)
    return out


def fixed_policy_table(res: dict[str, dict[str, list[float]]]) -> str:
    """Per row: sign agreement, Spearman, NMSE against the fixed behaviour policy's exact advantage."""
    rows = [[name, *[report.fmt_ci(*mean_ci(m[k])) for k in ("sign", "spearman", "nmse")]] for name, m in res.items()]
    return report.markdown_table(["row", "sign agree", "Spearman", "NMSE"], rows)


def _rank_corr(a: np.ndarray, b: np.ndarray) -> str:
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return "n/a (a constant column)"
    return f"{stats.spearmanr(a, b).statistic:+.2f}"


def predictiveness_table(final: dict[str, list[RunResult]], fixed: dict[str, dict[str, list[float]]] | None,
                         target: float, tau: float, ref_runs: Sequence[RunResult] | None = None) -> str:
    """Spearman correlation, across rows, between each fidelity measure and learning (speed = minus the
    restricted mean steps to ``target``; final success). Higher fidelity should mean faster learning."""
    names = list(final)
    speed = [-rmst(censored(final[n], target), tau)[0] for n in names]
    succ = [float(np.mean(final_success(final[n]))) for n in names]
    measures: dict[str, list[float]] = {}
    if fixed:
        measures["fixed-policy Spearman"] = [float(np.mean(fixed[n]["spearman"])) if n in fixed else np.nan for n in names]
        measures["fixed-policy sign agree"] = [float(np.mean(fixed[n]["sign"])) if n in fixed else np.nan for n in names]
        measures["fixed-policy -NMSE"] = [-float(np.mean(fixed[n]["nmse"])) if n in fixed else np.nan for n in names]
    for m, phase, label in (("spearman", "all", "on-policy Spearman"), ("spearman", "late", "on-policy Spearman, late"),
                            ("spearman_zero", "all", "on-policy Spearman, zero-signal tasks"),
                            ("sign", "all", "on-policy sign agree"), ("nmse", "all", "on-policy -NMSE"),
                            ("cosine", "all", "on-policy update cosine")):
        vals = [onpolicy_summary(final[n], m, phase)[0] for n in names]
        measures[label] = [-v for v in vals] if m == "nmse" else vals
    if ref_runs:
        for m, label in (("spearman", "matched-policy Spearman"), ("spearman_zero", "matched-policy Spearman, zero-signal"),
                         ("sign", "matched-policy sign agree"), ("nmse", "matched-policy -NMSE"),
                         ("cosine", "matched-policy update cosine")):
            vals = [matched_summary(ref_runs, n, m)[0] for n in names]
            measures[label] = [-v for v in vals] if m == "nmse" else vals
    rows = []
    for label, vals in measures.items():
        v = np.asarray(vals, dtype=np.float64)
        ok = np.isfinite(v)
        if ok.sum() < 3:
            continue
        rows.append([label, _rank_corr(v[ok], np.asarray(speed)[ok]), _rank_corr(v[ok], np.asarray(succ)[ok]),
                     str(int(ok.sum()))])
    if not rows:
        return "(fewer than 3 rows with probes: no correlation across rows)"
    return report.markdown_table(["fidelity measure", f"rank corr. with learning speed (to {target:.0%})",
                                  "rank corr. with final success", "rows"], rows)


def ratio_table(final: dict[str, list[RunResult]], references: Sequence[str], target: float = 0.8,
                oracle: str | None = None) -> str:
    """Per row, its collapsed seeds, its restricted mean steps to ``target`` divided by each reference row's
    (percentile bootstrap 95% interval over seeds; tau from :func:`common_tau`, as in :func:`main_table`)
    and, with an ``oracle`` row, the share of each reference-to-oracle gap it closes (:func:`gap_share`).

    Raises:
        ValueError: a reference or oracle that is not a row of ``final`` (names the rows).
    """
    missing = [r for r in [*references, *([oracle] if oracle else [])] if r not in final]
    if missing:
        raise ValueError(f"reference rows {missing} are not in the runs; rows: {list(final)}")
    tau = common_tau(list(final.values()), target)
    header = ["row", "final success", "collapsed", f"restricted mean to {target:.0%} (tau {tau / 1e3:,.0f}k)"]
    header += [f"x {ref} [95%]" for ref in references]
    if oracle:
        header += [f"share of the {ref}->{oracle} gap closed [95%]" for ref in references]
    rows = []
    for name, runs in final.items():
        c = censored(runs, target)
        r, h = rmst(c, tau)
        row = [name, report.fmt_ci(*mean_ci(final_success(runs))), fmt_collapsed(runs), f"{r:,.0f} ± {h:,.0f}"]
        for ref in references:
            q, lo, hi = rmst_ratio(c, censored(final[ref], target), tau)
            row.append(f"{q:.2f} [{lo:.2f}, {hi:.2f}]")
        if oracle:
            row += [_fmt_share(gap_share(c, censored(final[ref], target), censored(final[oracle], target), tau))
                    for ref in references]
        rows.append(row)
    return report.markdown_table(header, rows)


@dataclass(frozen=True)
class ReportArgs:
    """The flags of ``python -m research.learning_report``."""

    runs: str
    """the *-runs.pkl a learning run wrote next to its report"""
    references: str = "gigpo,hgpo"
    """comma list of reference rows"""
    target: float = number(0.8, "(0, 1]")
    """success rate whose first crossing is reported"""
    oracle: str = "oracle"
    """row of the gap-share columns ('' or absent = none)"""


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.learning_report --runs RUNS.pkl --references gigpo,hgpo``: the ratio table of a
    finished learning run (its ``*-runs.pkl``) against several reference rows, opened by the oracle's headroom
    line over the first reference (:func:`headroom_line`) when the run has both rows."""
    import pickle
    import sys

    from research import settings as lab_settings

    from progpo.run.flags import comma_list

    prog = "python -m research.learning_report"
    try:
        args = lab_settings.parse(ReportArgs, sys.argv[1:] if argv is None else argv, prog, main.__doc__)
        references = comma_list(args.references, "--references")
        with open(args.runs, "rb") as fh:
            final = pickle.load(fh)["final"]  # noqa: S301 - our own run files
    except (ValueError, OSError) as exc:  # a bad flag or an unreadable file: one line, exit 2
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, AttributeError, ImportError) as exc:
        print(f"{prog}: error: --runs {args.runs} is no learning run's *-runs.pkl ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return 2
    oracle = args.oracle if args.oracle in final else None
    try:
        table = ratio_table(final, references, args.target, oracle)
    except ValueError as exc:  # a reference that is no row of the run
        print(f"{prog}: error: --references: {exc}", file=sys.stderr)
        return 2
    if oracle:
        print(headroom_line(final, args.target, references[0], oracle) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
