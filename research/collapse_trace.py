"""``python -m research.collapse_trace``: what happens before and after one learning run collapses.

Replays one run of the learning benchmark (:func:`research.learner.train_run`: same task draw, seed,
row and learning rate, so the same batches) and prints, per iteration, what the policy did and what
each estimator made of it:

* **trace**: batch success, mean episode return, share of tasks whose ``N`` returns are all equal,
  mean policy entropy over the nodes the batch visited (nats), mean episode length, the mean ``|A|`` of
  the row's advantages and of the ``--compare`` rows' advantages *on the same batch*, the norm of the
  row's parameter update ``lr / n_episodes * sum A grad log pi``, its cosine with the update the exact
  advantage ``A*`` of the same policy would make (n/a when either is 0), and the three most taken action kinds
  (the shared-feature action kind of :meth:`progpo.envs.synthetic.families.TaskFamily.features`; the first word of
  the action with the tabular policy);
* **escape** (``--escape_at k``): from the row's parameters after ``k`` iterations, every
  ``--escape_with`` row (or ``oracle``: the exact advantage, :func:`research.learner.oracle_advantages`)
  continues training on the same later batches' tasks, with a copy of the same random stream; mean
  success per 10 iterations. A state no row leaves is absorbing for every estimator.
* **sizes** (``--sizes_seeds n``): along the ``--sizes_path`` row's training path (seeds 0..n-1, the
  first ``--sizes_iterations`` iterations), the mean norm of each row's update at the same ``lr`` and
  its projection on the exact policy gradient (REINFORCE with ``A*``, Williams 1992 eq. 11; unit vector),
  relative to the first ``--compare`` row.

Written for docs/fidelity.md, "Why ProGPO's default collapsed".
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from progpo.advantages import compute_advantages
from research import engine, report
from progpo.envs.synthetic.families import get_family
from research.fidelity_core import ORACLE_ROW, select_variants
from research.learner import Context, TaskSource, build_source, make_context, oracle_advantages
from research.learning import lab_task_config
from progpo.bounds import check_fields, number
from progpo.run.settings import RolloutSettings
from progpo.run.flags import comma_list
from research import settings as lab_settings
from research.settings import LabTrainSettings, check_counts, rollout_section, train_section


def _advantages(ctx: Context, row, roll: engine.Rollout, g: engine.Graph, p: np.ndarray) -> np.ndarray:
    """``[S]`` advantages of ``row`` (a Variant, or None for the exact-advantage oracle) on ``roll``."""
    if row is None:
        return oracle_advantages(engine.exact_advantages(g, p, roll)[0])
    return compute_advantages(roll.batch, row.config(ctx.base), None).advantages


def _rows(names: str, flag: str, *, one: bool = False) -> list:
    """Variants of comma-list flag ``flag`` (``oracle`` = None); ``one``: exactly one row.

    Raises:
        ValueError: naming ``flag``: an empty entry, no row where ``one`` asks for one (or more than one), a row
            that is no estimator.
    """
    items = comma_list(names, flag)
    if one and len(items) != 1:
        raise ValueError(f"{flag} must name one row, got {names!r}")
    try:
        return [None if n == ORACLE_ROW else select_variants([n])[0] for n in items]
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def _kinds(src: TaskSource, g: engine.Graph, roll: engine.Rollout) -> str:
    if src.feature_names:
        names = [src.feature_names[k].removeprefix("act|") for k in g.sa_feat[roll.sa, 1]]
    else:
        names = [str(a).split("[")[0].split(" ")[0] for a in roll.batch.action]
    kinds, counts = np.unique(np.asarray(names, dtype=object), return_counts=True)
    top = np.argsort(-counts, kind="stable")[:3]
    return ", ".join(f"{kinds[i]} {counts[i] / counts.sum():.2f}" for i in top)


def _entropy(g: engine.Graph, p: np.ndarray, nodes: np.ndarray) -> float:
    """Mean over the distinct ``nodes`` of the policy entropy ``-sum_a pi log pi`` (nats)."""
    h = []
    for n in np.unique(nodes):
        q = p[g.node_sa_ptr[n]:g.node_sa_ptr[n + 1]]
        h.append(float(-(q * np.log(np.maximum(q, 1e-300))).sum()))
    return float(np.mean(h))


def trace(ctx: Context, row, lr: float, seed: int, iterations: int, rollouts: int, compare: list,
          escape_at: int = 0, escape_with: Sequence = ()) -> tuple[list[list[str]], dict[str, list[float]]]:
    """The trace rows (one per iteration) and, with ``escape_at > 0``, each escape row's success curve."""
    src = ctx.source
    rng = np.random.default_rng([seed, 4242])  # train_run's stream: the same batches
    order = src.order(seed, iterations)
    theta = np.zeros(src.n_params)
    n_ep = src.tasks_per_batch * rollouts
    lines, escapes = [], {}
    for it in range(iterations):
        if escape_at and it == escape_at:
            for other in escape_with:
                th, r, succ = theta.copy(), copy.deepcopy(rng), []
                for jt in range(it, iterations):
                    g = src.graph(order, jt)
                    p = engine.policy_probs(g, th)
                    roll = engine.rollout(g, p, rollouts, r, ctx.history)
                    th = th + lr / n_ep * engine.policy_gradient(g, p, roll, _advantages(ctx, other, roll, g, p),
                                                                 src.n_params)
                    succ.append(float(roll.success.mean()))
                escapes[ORACLE_ROW if other is None else other.name] = succ
        g = src.graph(order, it)
        p = engine.policy_probs(g, theta)
        roll = engine.rollout(g, p, rollouts, rng, ctx.history)
        adv = _advantages(ctx, row, roll, g, p)
        ret = np.bincount(roll.batch.traj_id, roll.batch.reward).reshape(-1, rollouts)
        step = lr / n_ep * engine.policy_gradient(g, p, roll, adv, src.n_params)
        exact = engine.policy_gradient(g, p, roll, engine.exact_advantages(g, p, roll)[0], src.n_params)
        norms = float(np.linalg.norm(step) * np.linalg.norm(exact))
        cos = f"{step @ exact / norms:.3f}" if norms > 0 else "n/a"
        others = [f"{np.mean(np.abs(_advantages(ctx, o, roll, g, p))):.3f}" for o in compare]
        lines.append([str(it), f"{roll.success.mean():.2f}", f"{ret.mean():.2f}",
                      f"{np.mean(np.ptp(ret, axis=1) < 1e-9):.2f}", f"{_entropy(g, p, roll.node):.3f}",
                      f"{roll.env_steps / n_ep:.1f}", f"{np.mean(np.abs(adv)):.3f}", *others,
                      f"{np.linalg.norm(step):.2f}", cos, _kinds(src, g, roll)])
        theta += step
    return lines, escapes


def sizes(ctx: Context, path_row, rows: list, lr: float, seeds: int, iterations: int,
          rollouts: int) -> dict[str, tuple[float, float]]:
    """Per row: (mean update norm, mean projection on the exact policy gradient's direction) along
    ``path_row``'s training path at ``lr`` (seeds ``0..seeds-1``, the first ``iterations`` iterations)."""
    src = ctx.source
    acc: dict[str, list[tuple[float, float]]] = {}
    for seed in range(seeds):
        rng = np.random.default_rng([seed, 4242])
        order = src.order(seed, iterations)
        theta = np.zeros(src.n_params)
        for it in range(iterations):
            g = src.graph(order, it)
            p = engine.policy_probs(g, theta)
            roll = engine.rollout(g, p, rollouts, rng, ctx.history)
            exact = engine.policy_gradient(g, p, roll, engine.exact_advantages(g, p, roll)[0], src.n_params)
            unit = exact / (np.linalg.norm(exact) or 1.0)
            for r in rows:
                grad = engine.policy_gradient(g, p, roll, _advantages(ctx, r, roll, g, p), src.n_params)
                acc.setdefault(ORACLE_ROW if r is None else r.name, []).append(
                    (float(np.linalg.norm(grad)), float(grad @ unit)))
            n_ep = src.tasks_per_batch * rollouts
            theta += lr / n_ep * engine.policy_gradient(g, p, roll, _advantages(ctx, path_row, roll, g, p),
                                                        src.n_params)
    return {k: (float(np.mean([a for a, _ in v])), float(np.mean([b for _, b in v]))) for k, v in acc.items()}


@dataclass(frozen=True)
class CollapseArgs:
    """The flags of ``python -m research.collapse_trace``."""

    family: str = "webshop"
    """task family: alfworld | webshop"""
    regime: Literal["fixed", "fresh"] = "fresh"
    """fixed: the same tasks every iteration; fresh: new tasks every iteration"""
    task_seed: int = 777
    """seed of the task draw"""
    task_preset: str = ""
    """named preset of the family's task config, as research learning's (e.g. hard); --task_config applies on top"""
    task_config: str = ""
    """comma list field=value overriding the family's task config, as research learning's"""
    row: str = "progpo"
    """the row whose run is traced"""
    lr: float = number(3.0, "> 0")
    """step size of the learner's policy"""
    train: LabTrainSettings = train_section("num_iterations", "seed", num_iterations=100, seed=5)
    rollout: RolloutSettings = rollout_section("batch_size", "n_samples_per_prompt", batch_size=16,
                                               n_samples_per_prompt=8)
    show: int = 20
    """trace lines printed (iterations 0..show-1)"""
    compare: str = "hgpo,gigpo,grpo"
    """rows whose |A| on the same batches is printed"""
    escape_at: int = 0
    """iteration the escape runs start from (0 = none)"""
    escape_with: str = "progpo,progpo zero_signal=off,hgpo,gigpo,grpo,oracle"
    """rows of the escape runs"""
    sizes_seeds: int = 0
    """seeds of the update-size table (0 = none)"""
    sizes_iterations: int = 20
    """iterations of each update-size run"""
    sizes_path: str = "hgpo"
    """row whose training path the sizes are measured on"""
    workers: int = 2
    """processes compiling the task pool"""

    def __post_init__(self) -> None:
        check_counts(self, {"show": 1, "sizes_iterations": 1, "workers": 1, "escape_at": 0, "sizes_seeds": 0,
                            "task_seed": 0})
        if self.train.seed < 0:
            raise ValueError(f"--train.seed must be >= 0, got {self.train.seed}")
        if self.escape_at >= self.train.num_iterations:
            raise ValueError(f"--escape_at must be below --train.num_iterations ({self.train.num_iterations}), "
                             f"got {self.escape_at}")
        check_fields(self, lambda name: f"--{name}")
        lab_task_config(self.family, self.task_preset, self.task_config)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The flags (:class:`CollapseArgs`) as the run reads them: the run shape as ``iterations``, ``tasks``,
    ``rollouts``, the seed as ``seed``; the rows parsed (``row_v``, ``compare_v``, ``escape_v``, ``path_v``).

    Raises:
        ValueError: naming the flag: a count < 1 (or < 0 where 0 = off), a non-positive lr, a bad row.
    """
    settings = lab_settings.parse(CollapseArgs, argv, "python -m research.collapse_trace", __doc__.split("\n\n")[0])
    args = lab_settings.flat(settings, iterations="train.num_iterations", seed="train.seed",
                             tasks="rollout.batch_size", rollouts="rollout.n_samples_per_prompt")
    args.row_v = _rows(args.row, "--row", one=True)[0]
    args.compare_v = _rows(args.compare, "--compare")
    args.escape_v = _rows(args.escape_with, "--escape_with")
    args.path_v = _rows(args.sizes_path, "--sizes_path", one=True)[0]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; prints markdown tables."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"python -m research.collapse_trace: error: {exc}", file=sys.stderr)
        return 2
    family = get_family(args.family)
    cfg = lab_task_config(args.family, args.task_preset, args.task_config)
    policy = "tabular" if args.regime == "fixed" else "features"
    src = build_source(family, cfg, args.regime, policy, args.tasks, args.task_seed, args.iterations * args.tasks,
                       args.workers)
    ctx = make_context(src, None)
    lines, escapes = trace(ctx, args.row_v, args.lr, args.seed, args.iterations, args.rollouts, args.compare_v,
                           args.escape_at, args.escape_v)
    names = [ORACLE_ROW if r is None else r.name for r in args.compare_v]
    preset = f", preset {args.task_preset}" if args.task_preset else ""
    over = f", task config {args.task_config}" if args.task_config else ""
    print(f"**Trace** of `{args.row}` at lr {args.lr:g}, seed {args.seed} ({args.family}{preset}{over}, {args.regime} "
          f"tasks, task seed {args.task_seed}, {args.tasks} tasks x {args.rollouts}; encoder none)\n")
    print(report.markdown_table(["it", "success", "mean R", "equal-return tasks", "entropy (nats)", "length",
                                 f"mean abs A ({args.row})", *[f"mean abs A ({n})" for n in names], "update norm",
                                 "update cosine with the exact one", "most taken action kinds"], lines[:args.show]))
    if escapes:
        print(f"\n**Escape** from `{args.row}`'s parameters after {args.escape_at} iterations (mean success per "
              f"10 iterations)\n")
        width = max(len(v) for v in escapes.values())
        heads = [f"{args.escape_at + i}-{min(args.escape_at + i + 9, args.escape_at + width - 1)}"
                 for i in range(0, width, 10)]
        print(report.markdown_table(["continued with", *heads],
                                    [[k, *[f"{np.mean(v[i:i + 10]):.2f}" for i in range(0, len(v), 10)]]
                                     for k, v in escapes.items()]))
    if args.sizes_seeds:
        rows = [args.row_v, *args.compare_v, None]
        got = sizes(ctx, args.path_v, rows, args.lr, args.sizes_seeds, args.sizes_iterations, args.rollouts)
        ref = next(iter(got.values())) if not names else got[names[0]]
        path = ORACLE_ROW if args.path_v is None else args.path_v.name
        print(f"\n**Update size** along `{path}`'s path (seeds 0..{args.sizes_seeds - 1}, iterations "
              f"0..{args.sizes_iterations - 1}, lr {args.lr:g}; mean over batches)\n")
        print(report.markdown_table(["row", "update norm", "projection on the exact gradient",
                                     f"norm / {names[0] if names else 'first'}"],
                                    [[k, f"{n:.1f}", f"{q:.1f}", f"{n / ref[0]:.2f}"] for k, (n, q) in got.items()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
