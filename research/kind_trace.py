"""``python -m research kinds``: each row's advantage against the exact one, per kind of step.

Trains the learning benchmark's learner (:func:`research.learner.train_run`'s update, same batches for a
given seed) along one row's path (``--path_row``, ProGPO's default unless told) and, every ``--every``
iterations, computes every ``--rows`` row's advantages *on the same batch* and the exact advantage ``A*`` of
the learner's current policy (:func:`research.engine.exact_advantages`). Each step gets the kinds of
:func:`step_kinds` (a step can have several); per row and kind the table prints:

* ``share``: the kind's share of the probed steps;
* ``Spearman``: rank correlation of the row's ``A`` with ``A*`` over the kind's steps of one probe, mean over
  the probes with at least 3 such steps (0 where either is constant, as
  :func:`research.fidelity_core.fidelity_metrics`);
* ``sign``: share of the kind's steps with ``|A*| >= --sign_threshold`` whose ``A`` has the sign of ``A*``
  (``A = 0`` counts as wrong);
* ``mean A`` and ``mean A*``: pooled means, each over its own batch's standard deviation (unitless, so
  that a row's normalisation does not decide the comparison);
* ``update cosine``: cosine of the updates ``sum_{steps of the kind} A grad log pi`` and the same with
  ``A*`` (REINFORCE, Williams 1992 eq. 11), mean over probes: how far the kind's steps push the policy
  where the truth would.

Written for docs/fidelity.md, "ProGPO on fresh tasks, by kind of step" (issue 32 item 3), on the model of
:mod:`research.collapse_trace`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

from progpo.advantages import AdvantageConfig, StepBatch, compute_advantages
from progpo.advantages._prep import prepare
from progpo.advantages.progpo import peer_term
from progpo.advantages.result import equal_return_tasks
from progpo.envs.synthetic.families import family_config, get_family
from research import engine, report
from research.fidelity_core import select_variants
from research.learner import Context, build_source, make_context
from progpo.bounds import check_fields, number
from progpo.run.settings import RolloutSettings
from progpo.run.flags import comma_list
from research import settings as lab_settings
from research.settings import LabTrainSettings, check_counts, rollout_section, train_section

#: The kinds of :func:`step_kinds`, in table order.
KINDS = ("all", "first step", "peer group >= 2", "credit, pool >= 2", "credit, singleton pool", "terminal",
         "truncated", "invalid", "equal-return task, won", "equal-return task, lost", "return-signal task")
#: The metrics of :func:`kind_trace`, per (row, kind).
METRICS = ("share", "spearman", "sign", "mean_a", "mean_astar", "cosine")


def step_kinds(batch: StepBatch, cfg: AdvantageConfig) -> dict[str, np.ndarray]:
    """Kind masks ``[S]`` (bool, the batch's row order) of a batch, by ProGPO's groups under ``cfg``.

    * ``first step``: ``t = 0``;
    * ``peer group >= 2``: ProGPO's exact-prefix peer term carries weight (``rho > 0``, spec (2));
    * ``credit, pool >= 2`` / ``credit, singleton pool``: ``rho = 0``, so the step's credit comes from the
      potential term (6) alone, and its depth-0 potential pool (spec (3), key ``state_key``) has >= 2 steps /
      only the step itself;
    * ``terminal`` / ``truncated``: the last step of an episode that ended in the task / at the horizon;
    * ``invalid``: an invalid action;
    * ``equal-return task, won`` / ``lost``: every episode of the step's task has the same return ``R``
      (``R = sum_t r_t``, :func:`progpo.advantages.result.equal_return_tasks`), and that return is > 0 / <= 0;
    * ``return-signal task``: the others.

    Raises:
        ValueError: a bad batch or config (:func:`progpo.advantages._prep.prepare`).
    """
    p = prepare(batch, cfg)
    _, rho, _ = peer_term(p)
    pool, k = p.depth_keys(0)[0]
    size = np.bincount(pool, minlength=k)[pool]
    flat = equal_return_tasks(p, "sum")
    won_task = np.zeros(p.n_tasks, dtype=bool)
    won_task[p.traj_task] = p.R > 0
    sorted_kinds = {
        "all": np.ones(p.S, dtype=bool), "first step": p.t == 0, "peer group >= 2": rho > 0,
        "credit, pool >= 2": (rho == 0) & (size >= 2), "credit, singleton pool": (rho == 0) & (size < 2),
        "terminal": p.ended_done, "truncated": p.last & ~p.ended_done, "invalid": batch.invalid[p.order],
        "equal-return task, won": flat & won_task[p.task], "equal-return task, lost": flat & ~won_task[p.task],
        "return-signal task": ~flat,
    }
    return {name: p.unsort(mask) for name, mask in sorted_kinds.items()}


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if a.size < 3:
        return float("nan")
    if np.ptp(a) < 1e-12 or np.ptp(b) < 1e-12:
        return 0.0
    return float(stats.spearmanr(a, b).statistic)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else float("nan")


def kind_trace(ctx: Context, path_row, rows: Sequence, lr: float, seeds: Sequence[int], iterations: int,
               rollouts: int, every: int, sign_threshold: float = 0.1,
               kind_cfg: AdvantageConfig | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Per row name, per kind of :data:`KINDS`, the :data:`METRICS` (see the module docstring).

    Args:
        ctx: the learning benchmark's context (:func:`research.learner.make_context`).
        path_row: the Variant whose advantages train the learner (its update and random stream are
            :func:`research.learner.train_run`'s, so the batches are the benchmark's).
        rows: Variants compared on every probed batch. lr: learning rate of the path.
        seeds: training seeds. iterations: updates per seed. rollouts: ``N`` per task.
        every: probe every this many iterations (and the last one). sign_threshold: ``|A*|`` (reward units)
            from which a step counts for sign agreement.
        kind_cfg: the config whose groups define the kinds (default: ProGPO's default on the context).
    Returns:
        ``{row: {kind: {metric: value}}}``; NaN where a kind never had enough steps.
    """
    src = ctx.source
    kcfg = kind_cfg or AdvantageConfig(**ctx.base)
    acc = {r.name: {k: {"n": 0, "big": 0, "agree": 0, "sa": 0.0, "sas": 0.0, "sp": [], "cos": []} for k in KINDS}
           for r in rows}
    total = 0
    for seed in seeds:
        rng = np.random.default_rng([seed, 4242])
        order = src.order(seed, iterations)
        theta = np.zeros(src.n_params)
        n_ep = src.tasks_per_batch * rollouts
        for it in range(iterations):
            g = src.graph(order, it)
            p = engine.policy_probs(g, theta)
            roll = engine.rollout(g, p, rollouts, rng, ctx.history)
            path_adv = compute_advantages(roll.batch, path_row.config(ctx.base), None).advantages
            if it % every == 0 or it == iterations - 1:
                total += roll.env_steps
                _probe(ctx, g, p, roll, rows, kcfg, sign_threshold, acc)
            theta += lr / n_ep * engine.policy_gradient(g, p, roll, path_adv, src.n_params)
    return {name: {k: _finish(a, total) for k, a in by_kind.items()} for name, by_kind in acc.items()}


def _probe(ctx: Context, g: engine.Graph, p: np.ndarray, roll: engine.Rollout, rows: Sequence,
           kcfg: AdvantageConfig, sign_threshold: float, acc: dict) -> None:
    """Add one batch to ``acc`` (row -> kind -> running sums): ``A*`` of policy ``p`` ``[Nsa]`` on ``roll``
    (``[S]``), each row's ``[S]`` advantages, the kinds of :func:`step_kinds` under ``kcfg``."""
    astar = engine.exact_advantages(g, p, roll)[0]
    sd_star = float(np.std(astar)) or 1.0
    masks = step_kinds(roll.batch, kcfg)
    exact_grad = {k: engine.policy_gradient(g, p, roll, np.where(m, astar, 0.0), ctx.source.n_params)
                  for k, m in masks.items()}
    for r in rows:
        adv = compute_advantages(roll.batch, r.config(ctx.base), None).advantages
        sd = float(np.std(adv)) or 1.0
        for k, m in masks.items():
            a = acc[r.name][k]
            big = m & (np.abs(astar) >= sign_threshold)
            a["n"] += int(m.sum())
            a["big"] += int(big.sum())
            a["agree"] += int(np.sum(np.sign(adv[big]) == np.sign(astar[big])))
            a["sa"] += float(adv[m].sum() / sd)
            a["sas"] += float(astar[m].sum() / sd_star)
            a["sp"].append(_spearman(adv[m], astar[m]))
            if m.any():
                a["cos"].append(_cos(engine.policy_gradient(g, p, roll, np.where(m, adv, 0.0), ctx.source.n_params),
                                     exact_grad[k]))


def _nanmean(x: list[float]) -> float:
    v = np.asarray(x, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else float("nan")


def _finish(a: dict, total: int) -> dict[str, float]:
    n = a["n"]
    return {"share": n / total if total else float("nan"), "spearman": _nanmean(a["sp"]),
            "sign": a["agree"] / a["big"] if a["big"] else float("nan"),
            "mean_a": a["sa"] / n if n else float("nan"), "mean_astar": a["sas"] / n if n else float("nan"),
            "cosine": _nanmean(a["cos"])}


def table(got: dict[str, dict[str, dict[str, float]]]) -> str:
    """The markdown table of :func:`kind_trace`'s result: one line per kind, the rows side by side."""
    names = list(got)
    head = ["kind", "share"]
    for n in names:
        head += [f"Spearman ({n})", f"sign ({n})", f"mean A / mean A* ({n})", f"update cosine ({n})"]
    lines = []
    for k in KINDS:
        first = got[names[0]][k]
        line = [k, f"{first['share']:.3f}"]
        for n in names:
            m = got[n][k]
            line += [_num(m["spearman"]), _num(m["sign"]), f"{_num(m['mean_a'], '+.3f')} / {_num(m['mean_astar'], '+.3f')}",
                     _num(m["cosine"])]
        lines.append(line)
    return report.markdown_table(head, lines)


def _num(x: float, spec: str = ".3f") -> str:
    return format(x, spec) if np.isfinite(x) else "-"


@dataclass(frozen=True)
class KindsArgs:
    """The flags of ``python -m research kinds``."""

    family: str = "alfworld"
    """task family: alfworld | webshop"""
    regime: Literal["fixed", "fresh"] = "fresh"
    """fixed: the same tasks every iteration; fresh: new tasks every iteration"""
    task_seed: int = 1
    """seed of the task draw"""
    path_row: str = "progpo"
    """the row whose advantages train the learner"""
    rows: str = "progpo,gigpo,g2po"
    """rows compared on the same batches"""
    lr: float = number(3.0, "> 0")
    """step size of the learner's policy"""
    seeds: int = 3
    """training seeds 0..n-1"""
    train: LabTrainSettings = train_section("num_iterations", num_iterations=100)
    rollout: RolloutSettings = rollout_section("batch_size", "n_samples_per_prompt", batch_size=16,
                                               n_samples_per_prompt=8)
    every: int = 5
    """probe every this many iterations"""
    sign_threshold: float = number(0.1, ">= 0")
    """|A*| from which a step counts for sign"""
    workers: int = 1
    """processes compiling the task pool"""

    def __post_init__(self) -> None:
        check_counts(self, {"seeds": 1, "every": 1, "workers": 1, "task_seed": 0})
        check_fields(self, lambda name: f"--{name}")
        get_family(self.family)


def _rows(text: str, flag: str, *, one: bool = False) -> list:
    """The rows of comma-list flag ``flag`` (:func:`select_variants`); ``one``: exactly one row.

    Raises:
        ValueError: naming ``flag``: no row (or more than one), an empty entry, a row that is no estimator.
    """
    names = comma_list(text, flag)
    if not names or (one and len(names) > 1):
        raise ValueError(f"{flag} must name {'one row' if one else 'at least one row'}, got {text!r}")
    try:
        return select_variants(names)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The flags (:class:`KindsArgs`) as the run reads them: the run shape as ``iterations``, ``tasks``,
    ``rollouts``; the rows parsed (``path_v``, ``rows_v``).

    Raises:
        ValueError: naming the flag: a count < 1, a non-positive lr, a bad row or family.
    """
    settings = lab_settings.parse(KindsArgs, argv, "python -m research kinds", __doc__.split("\n\n")[0])
    args = lab_settings.flat(settings, path="path_row", iterations="train.num_iterations", tasks="rollout.batch_size",
                             rollouts="rollout.n_samples_per_prompt")
    args.path_v = _rows(args.path, "--path_row", one=True)[0]
    args.rows_v = _rows(args.rows, "--rows")
    if args.path_v.exact or any(r.exact for r in args.rows_v):
        raise ValueError("--path_row/--rows: the oracle row is the truth itself; name estimator rows")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; prints the markdown table (exit 2 with one line on a bad flag)."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"python -m research kinds: error: {exc}", file=sys.stderr)
        return 2
    family = get_family(args.family)
    policy = "tabular" if args.regime == "fixed" else "features"
    src = build_source(family, family_config(family, "learn"), args.regime, policy, args.tasks, args.task_seed,
                       args.iterations * args.tasks, args.workers)
    ctx = make_context(src, None)
    got = kind_trace(ctx, args.path_v, args.rows_v, args.lr, range(args.seeds), args.iterations, args.rollouts,
                     args.every, args.sign_threshold)
    print(f"**Advantage against A* by kind of step** along `{args.path}`'s path at lr {args.lr:g} ({args.family}, "
          f"{args.regime} tasks, task seed {args.task_seed}, seeds 0..{args.seeds - 1}, {args.iterations} iterations, "
          f"probe every {args.every}; {args.tasks} tasks x {args.rollouts}; encoder none)\n")
    print(table(got))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
