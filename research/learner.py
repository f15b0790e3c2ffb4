"""Training runs of the learning benchmark: task regimes, the learner's parameters, on-policy fidelity.

One run trains the log-linear learner of :mod:`research.engine` from all-zero parameters with one
estimator row at one learning rate and seed:

    theta <- theta + lr / n_episodes * sum_steps A_step * grad log pi(a_step | o_step)

(REINFORCE with step advantages, Williams 1992 eq. 11; one on-policy update per batch of ``tasks x
rollouts`` episodes, as GRPO/GiGPO train). Regimes:

* ``fixed``: the same ``tasks`` tasks every iteration (the benchmark of docs/fidelity.md so far);
  the policy is tabular per task (``theta_obs[task, obs, action] + theta_act[task, action]``) or the
  shared features;
* ``fresh``: every iteration draws ``tasks`` new tasks from a pool (by default ``iterations x tasks``
  tasks, so a run never sees a task twice), as real ALFWorld/WebShop training does; only the shared
  features (:meth:`progpo.envs.synthetic.families.TaskFamily.features`) can generalise, so the policy is theirs.

Every ``probe_every`` iterations the run compares the row's advantages of the batch with the exact
advantage ``A*`` of the learner's *current* policy (backward induction, :func:`engine.exact_values`):
sign agreement, Spearman, Pearson, NMSE (:func:`research.fidelity_core.fidelity_metrics`), the
cosine between the update it makes and the update ``A*`` would make, and the same on the tasks whose
``N`` returns are all equal ("zero-signal" tasks), and ``J``, the policy's exact expected return. A
row's own probes compare each row on a different policy (its own training path: a row that learns
slowly is judged on early, easier-to-rank policies); ``RunSpec.also`` probes other rows' advantages on
*this* run's batches, so all rows are compared on the same policies ("matched-policy fidelity").
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from progpo.advantages import compute_advantages
from research import engine
from progpo.envs.synthetic.families import TaskFamily, task_seeds
from research.fidelity_core import Variant, config_base, fidelity_metrics

PROBE_METRICS = ("sign", "spearman", "pearson", "nmse", "cosine", "spearman_zero", "cosine_zero", "zero_share",
                 "abs_adv_zero", "J")


@dataclass
class TaskSource:
    """The tasks of every iteration and the learner's parameter space.

    Attributes:
        regime: ``fixed`` or ``fresh``; policy: ``tabular`` or ``features``.
        tasks: compiled tasks (fixed: the batch; fresh: the pool); tasks_per_batch: tasks per iteration.
        n_params: ``P``; feat: per task ``[Nsa, F]`` feature indices (features policy).
        feature_names: the shared-feature vocabulary (index -> name; features policy).
    """

    regime: str
    policy: str
    tasks: list[engine.CompiledTask]
    tasks_per_batch: int
    n_params: int
    feat: list[np.ndarray] | None = None
    feature_names: list[str] = field(default_factory=list)
    history: int = 2  #: K, (observation, action) pairs of the prompt (prefix keys)
    _fixed: engine.Graph | None = None

    def order(self, seed: int, iterations: int) -> np.ndarray | None:
        """``[I, tasks]`` pool indices per iteration (fresh; the same for every row at one seed)."""
        if self.regime == "fixed":
            return None
        rng = np.random.default_rng([seed, 777])
        need = iterations * self.tasks_per_batch
        perms = [rng.permutation(len(self.tasks)) for _ in range(-(-need // len(self.tasks)))]
        return np.concatenate(perms)[:need].reshape(iterations, self.tasks_per_batch)

    def graph(self, order: np.ndarray | None, it: int) -> engine.Graph:
        """The graph of iteration ``it``."""
        if order is None:
            if self._fixed is None:
                if self.policy == "tabular":
                    self._fixed = engine.tabular_graph(self.tasks)[0]
                else:
                    self._fixed = _feature_graph(self.tasks, self.feat)
            return self._fixed
        pick = order[it]
        return _feature_graph([self.tasks[i] for i in pick], [self.feat[i] for i in pick])


def _feature_graph(tasks: list[engine.CompiledTask], feats: list[np.ndarray]) -> engine.Graph:
    width = max(f.shape[1] for f in feats)
    mat = np.concatenate([np.pad(f, ((0, 0), (0, width - f.shape[1]))) for f in feats])
    return engine.Graph(tasks, mat, tasks[0].horizon, tasks[0].gamma, padded=True)


def _compile_chunk(job) -> list[engine.CompiledTask]:
    family, cfg, seeds, with_features = job
    return [engine.compile_task(family.make_task(cfg, s), features=family.features if with_features else None)
            for s in seeds]


def build_source(family: TaskFamily, cfg: Any, regime: str, policy: str, n_tasks: int, task_seed: int,
                 pool: int, workers: int) -> TaskSource:
    """Generate and compile the tasks of a regime (the pool in parallel over ``workers`` processes).

    Raises:
        ValueError: an unknown regime/policy, or the tabular policy with fresh tasks (per-task
            parameters cannot carry over to unseen tasks).
    """
    if regime not in ("fixed", "fresh") or policy not in ("tabular", "features"):
        raise ValueError(f"--regime must be fixed|fresh and --policy tabular|features, got {regime!r}, {policy!r}")
    if regime == "fresh" and policy == "tabular":
        raise ValueError("--regime fresh needs --policy features: per-task tabular parameters never see a task twice")
    seeds = task_seeds(n_tasks if regime == "fixed" else pool, task_seed)
    feats = policy == "features"
    chunks = [seeds[i:i + 100] for i in range(0, len(seeds), 100)]
    if workers > 1 and len(chunks) > 1:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            tasks = [t for part in ex.map(_compile_chunk, [(family, cfg, c, feats) for c in chunks]) for t in part]
    else:
        tasks = [t for c in chunks for t in _compile_chunk((family, cfg, c, feats))]
    if not feats:
        return TaskSource(regime, policy, tasks, n_tasks, engine.tabular_graph(tasks)[1], history=cfg.history)
    index = engine.FeatureIndex()
    mats = []
    for t in tasks:
        mats.append(index.matrix(t))
        t.sa_feat_names = None  # interned; free the strings
    return TaskSource(regime, policy, tasks, n_tasks, len(index), mats, list(index.ids), history=cfg.history)


@dataclass(frozen=True)
class RunSpec:
    """One training run: row, learning rate, seed and budget (iterations of ``tasks x rollouts`` episodes)."""

    row: Variant
    lr: float
    seed: int
    iterations: int
    rollouts: int
    probe_every: int = 0  #: 0 = no on-policy fidelity probes
    sign_threshold: float = 0.1
    #: rows whose advantages are also probed on this run's batches (matched-policy fidelity)
    also: tuple[Variant, ...] = ()


@dataclass
class RunResult:
    """Curves of one run: ``steps`` / ``success`` ``[I]`` (cumulative env steps, batch success rate),
    ``probe_it`` ``[k]`` and ``probes`` (metric -> ``[k]``) and the run's CPU seconds."""

    spec: RunSpec
    steps: np.ndarray
    success: np.ndarray
    probe_it: np.ndarray
    probes: dict[str, np.ndarray]
    cpu_s: float
    matched: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  #: row -> metric -> ``[k]``


@dataclass
class Context:
    """What every run of one benchmark invocation shares (set before the worker processes fork)."""

    source: TaskSource
    base: dict[str, object]
    history: int
    encoder: Any = None


_CTX: Context | None = None


def make_context(source: TaskSource, encoder=None) -> Context:
    """The shared context of ``source``'s runs (estimator base config from the first task)."""
    t = source.tasks[0]
    return Context(source, config_base(t.horizon, t.gamma, t.success_reward), source.history, encoder)


def train_run(ctx: Context, spec: RunSpec) -> RunResult:
    """Train one run (see the module docstring); deterministic given the spec."""
    c0 = time.process_time()
    src = ctx.source
    rng = np.random.default_rng([spec.seed, 4242])
    order = src.order(spec.seed, spec.iterations)
    theta = np.zeros(src.n_params)
    cfg = spec.row.config(ctx.base)
    enc = ctx.encoder if spec.row.needs_encoder else None
    n_ep = src.tasks_per_batch * spec.rollouts
    steps, succ, probe_it, probes, total = [], [], [], {m: [] for m in PROBE_METRICS}, 0
    matched: dict[str, dict[str, list[float]]] = {}
    for it in range(spec.iterations):
        g = src.graph(order, it)
        p = engine.policy_probs(g, theta)
        roll = engine.rollout(g, p, spec.rollouts, rng, ctx.history)
        astar = start = None
        if spec.row.exact:
            astar, start = engine.exact_advantages(g, p, roll)
            adv = oracle_advantages(astar)
        else:
            adv = compute_advantages(roll.batch, cfg, enc).advantages
        if spec.probe_every and (it % spec.probe_every == 0 or it == spec.iterations - 1):
            probe_it.append(it)
            if astar is None:
                astar, start = engine.exact_advantages(g, p, roll)
            for k, v in probe(g, p, roll, adv, astar, src.n_params, spec.rollouts, spec.sign_threshold).items():
                probes[k].append(v)
            probes["J"].append(float(start.mean()))
            for other in spec.also:
                if other.exact:
                    continue
                o_adv = compute_advantages(roll.batch, other.config(ctx.base),
                                           ctx.encoder if other.needs_encoder else None).advantages
                got = probe(g, p, roll, o_adv, astar, src.n_params, spec.rollouts, spec.sign_threshold)
                for k, v in got.items():
                    matched.setdefault(other.name, {}).setdefault(k, []).append(v)
        theta += spec.lr / n_ep * engine.policy_gradient(g, p, roll, adv, src.n_params)
        total += roll.env_steps
        steps.append(float(total))
        succ.append(float(roll.success.mean()))
    return RunResult(spec, np.asarray(steps), np.asarray(succ), np.asarray(probe_it, dtype=np.int64),
                     {k: np.asarray(v, dtype=np.float64) for k, v in probes.items()}, time.process_time() - c0,
                     {r: {k: np.asarray(v, dtype=np.float64) for k, v in m.items()} for r, m in matched.items()})


def oracle_advantages(astar: np.ndarray) -> np.ndarray:
    """The ``oracle`` row's advantages: ``A* / std(A*)`` over the batch's ``[S]`` steps (unitless).

    ``A*`` (reward units) is the exact advantage ``Q(o, a) - V(o)`` of the policy that sampled the batch
    (Sutton & Barto 2018, eq. 13.11 with the advantage as baseline-subtracted return). Dividing by its
    batch standard deviation puts it on the scale of the estimators' normalised advantages (std ~1), so
    the same learning-rate grid fits every row; it is not centred (the truth already is, per state). A
    batch with ``std(A*) = 0`` (every action equally good) gets zero advantages.
    """
    astar = np.asarray(astar, dtype=np.float64)
    sd = float(np.std(astar))
    return astar / sd if sd > 1e-12 * max(1.0, float(np.max(np.abs(astar)))) else np.zeros_like(astar)


def probe(g: engine.Graph, p: np.ndarray, roll: engine.Rollout, adv: np.ndarray, astar: np.ndarray, n_params: int,
          rollouts: int, sign_threshold: float) -> dict[str, float]:
    """On-policy fidelity of ``adv`` ``[S]`` against ``astar`` ``[S]``, the exact advantage of the policy ``p``
    that sampled ``roll`` (:func:`engine.exact_advantages`).

    Returns:
        ``fidelity_metrics`` (sign, spearman, pearson, nmse); ``cosine``: cosine between the parameter
        updates ``sum A grad log pi`` with ``adv`` and with ``A*``; the same two on "zero-signal" tasks
        (every return equal; NaN when there is none) and their share ``zero_share``; ``abs_adv_zero``:
        mean ``|adv|`` on zero-signal steps divided by ``std(adv)``.
    """
    out = fidelity_metrics(adv, astar, sign_threshold)
    out["cosine"] = _cos(engine.policy_gradient(g, p, roll, adv, n_params),
                         engine.policy_gradient(g, p, roll, astar, n_params))
    ret = np.bincount(roll.batch.traj_id, roll.batch.reward)
    by_task = ret.reshape(-1, rollouts)
    zero_task = np.ptp(by_task, axis=1) < 1e-9
    zero = zero_task[roll.batch.traj_id // rollouts]
    out["zero_share"] = float(zero_task.mean())
    out["spearman_zero"] = out["cosine_zero"] = out["abs_adv_zero"] = float("nan")
    if zero.sum() > 1:
        out["spearman_zero"] = fidelity_metrics(adv[zero], astar[zero], sign_threshold)["spearman"]
        mask = np.where(zero, 1.0, 0.0)
        out["cosine_zero"] = _cos(engine.policy_gradient(g, p, roll, adv * mask, n_params),
                                  engine.policy_gradient(g, p, roll, astar * mask, n_params))
        sd = float(np.std(adv))
        out["abs_adv_zero"] = float(np.mean(np.abs(adv[zero])) / sd) if sd > 0 else 0.0
    return out


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0


def run_job(spec: RunSpec) -> RunResult:
    """One run in a worker process (the context was set before the fork)."""
    if _CTX is None:
        raise RuntimeError("learner context not set (call run_all)")
    return train_run(_CTX, spec)


def run_all(ctx: Context, specs: list[RunSpec], workers: int) -> list[RunResult]:
    """Every spec, in parallel over ``workers`` forked processes (1 = in this process); results in order."""
    global _CTX
    _CTX = ctx
    t0, out = time.perf_counter(), []
    step = max(1, len(specs) // 10)

    def note(res: RunResult) -> None:  # progress on stderr, about every 10% of the runs
        out.append(res)
        if len(out) % step == 0 or len(out) == len(specs):
            print(f"[learning] {len(out)}/{len(specs)} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                  flush=True)

    if workers <= 1 or len(specs) <= 1:
        for s in specs:
            note(train_run(ctx, s))
        return out
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork")) as ex:
        for res in ex.map(run_job, specs, chunksize=1):
            note(res)
    return out
