"""Fidelity on real ALFWorld games (``fidelity --mode alfworld``; opt-in, slow).

Behaviour policy: a noisy expert. Its history-dependent state is ``k``, the number of walkthrough actions
already executed in order; with probability ``p`` it plays ``walkthrough[k]`` when admissible (else it
walks back to the last "go to" of the walkthrough before ``k``, else a random admissible action), and
with probability ``1 - p`` a uniformly random admissible action.

Truth: the game is deterministic given its file, so ``h_{t+1}`` is a function of ``(h_t, a_t)`` and
``A*(h_t, a_t) = r_t + gamma V(h_{t+1}) - V(h_t)`` exactly, with ``V(h) = 0`` after the last step. Each
``V(h)`` is estimated by ``M`` continuations of the behaviour policy after replaying ``h``'s actions from
``reset`` (cached per action prefix, so trajectories sharing a prefix share the estimate); the standard
error of each ``A*`` is ``sqrt(gamma^2 se(V_{t+1})^2 + se(V_t)^2)`` and is reported. Every continuation
costs one slow ``reset`` (docs/alfworld.md, "The env") plus its steps, hence the small defaults.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field

import numpy as np

from progpo.advantages import StepBatch, compute_advantages
from research import report
from research.fidelity_core import METRICS, config_base, fidelity_metrics, prompt_key, select_variants


class NoisyExpert:
    """Walkthrough-following behaviour policy (see the module docstring); ``p`` in [0, 1]."""

    def __init__(self, walkthrough: list[str], p: float) -> None:
        if not 0 <= p <= 1:
            raise ValueError(f"--p_expert must be in [0, 1], got {p}")
        self.walkthrough, self.p = [a.lower() for a in walkthrough], p

    def progress(self, actions: list[str]) -> int:
        """``k``: walkthrough actions executed in order in ``actions``."""
        k = 0
        for a in actions:
            if k < len(self.walkthrough) and a == self.walkthrough[k]:
                k += 1
        return k

    def act(self, actions: list[str], admissible: list[str], rng: np.random.Generator) -> str:
        """Sample the next action given the action history and the admissible list."""
        if rng.random() < self.p:
            k = self.progress(actions)
            if k < len(self.walkthrough) and self.walkthrough[k] in admissible:
                return self.walkthrough[k]
            back = [a for a in self.walkthrough[:k] if a.startswith("go to ")]
            if back and back[-1] in admissible:
                return back[-1]
        return admissible[int(rng.integers(len(admissible)))]


@dataclass
class Trace:
    """One played episode (or continuation): per-step records and the discounted return."""

    obs: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    admissible: list[list[str]] = field(default_factory=list)
    inventory: list[str] = field(default_factory=list)
    invalid: list[bool] = field(default_factory=list)
    terminated: bool = False
    task: str = ""
    final_obs: str = ""


def play(env, split: str, index: int, prefix: list[str], policy: NoisyExpert, rng, gamma: float) -> tuple[Trace, float]:
    """Reset, replay ``prefix``, then follow ``policy`` to the end; returns the trace and the discounted
    return collected after the prefix (reward units)."""
    obs, info = env.reset(split=split, index=index)
    tr = Trace(task=info.get("task", ""))
    ret = 0.0
    for t in range(env.max_steps):
        adm = list(info["admissible_actions"])
        action = prefix[t] if t < len(prefix) else policy.act(tr.actions, adm, rng)
        tr.obs.append(obs)
        tr.admissible.append(adm)
        tr.inventory.append(str(info.get("inventory", "")))
        res = env.step(action)
        tr.actions.append(action)
        tr.rewards.append(float(res.reward))
        tr.invalid.append(bool(res.info.get("invalid_action", False)))
        if t >= len(prefix):
            ret += gamma ** (t - len(prefix)) * float(res.reward)
        obs, info = res.observation, res.info
        tr.final_obs = obs
        if res.done:
            tr.terminated = bool(res.terminated)
            break
    return tr, ret


def estimate_truth(env, split, index, trace: Trace, policy, rng, m: int, gamma: float, cache: dict):
    """``A*`` and its standard error for every step of ``trace`` (``V`` by ``m`` continuations per prefix)."""
    def value(prefix: tuple[str, ...]) -> tuple[float, float]:
        if prefix not in cache:
            rets = [play(env, split, index, list(prefix), policy, rng, gamma)[1] for _ in range(m)]
            cache[prefix] = (float(np.mean(rets)), float(np.std(rets, ddof=1) / np.sqrt(m)) if m > 1 else 0.0)
        return cache[prefix]

    n = len(trace.actions)
    vals = [value(tuple(trace.actions[:t])) for t in range(n)]
    ended = trace.terminated or n >= env.max_steps
    vals.append((0.0, 0.0) if ended else value(tuple(trace.actions)))
    adv = [trace.rewards[t] + gamma * vals[t + 1][0] - vals[t][0] for t in range(n)]
    se = [float(np.hypot(gamma * vals[t + 1][1], vals[t][1])) for t in range(n)]
    return adv, se


def run_alfworld(args: argparse.Namespace) -> str:
    """Sample noisy-expert batches on the chosen games, estimate the truth, score every estimator."""
    from progpo.envs.alfworld import AlfWorldEnv

    t0 = time.perf_counter()
    games = [int(x) for x in str(args.games).split(",") if x.strip()]
    if not games or args.continuations < 1 or args.alf_rollouts < 1:
        raise ValueError("--games must list game indices; --continuations and --rollout.n_samples_per_prompt must be >= 1")
    gamma = 0.95
    env = AlfWorldEnv(max_steps=args.alf_max_steps)
    rng = np.random.default_rng([args.seed, 99])
    cols: dict[str, list] = {k: [] for k in ("uid", "traj_id", "step_index", "reward", "terminated", "truncated",
                                             "invalid", "anchor_obs", "prefix_key", "action", "state_extra",
                                             "final_obs")}
    truth, ses, wins, resets = [], [], [], 0
    tid = 0
    try:
        for g in games:
            game_file = env.games(args.split)[env.game_index(args.split, index=g)]
            with open(game_file) as fh:
                policy = NoisyExpert(json.load(fh)["walkthrough"], args.p_expert)
            cache: dict = {}
            for _ in range(args.alf_rollouts):
                tr, _ = play(env, args.split, g, [], policy, rng, gamma)
                adv, se = estimate_truth(env, args.split, g, tr, policy, rng, args.continuations, gamma, cache)
                _append(cols, tr, tid, f"{args.split}/{g}", args.alf_history, env.max_steps)
                truth += adv
                ses += se
                wins.append(tr.terminated)
                tid += 1
            resets += args.alf_rollouts + len(cache) * args.continuations
    finally:
        env.close()
    batch = StepBatch.from_lists(**cols)
    return _report(args, batch, np.asarray(truth), np.asarray(ses), wins, resets, time.perf_counter() - t0, games,
                   env.max_steps)


def _append(cols, tr: Trace, tid: int, uid: str, k: int, max_steps: int) -> None:
    n = len(tr.actions)
    for t in range(n):
        last = t == n - 1
        pairs = list(zip(tr.obs[max(0, t - k):t], tr.actions[max(0, t - k):t])) if k else []
        for name, val in (("uid", uid), ("traj_id", tid), ("step_index", t), ("reward", tr.rewards[t]),
                          ("terminated", last and tr.terminated), ("truncated", last and not tr.terminated),
                          ("invalid", tr.invalid[t]), ("anchor_obs", tr.obs[t]),
                          ("prefix_key", prompt_key(tr.task, t, pairs, tr.obs[t], tr.admissible[t])),
                          ("action", tr.actions[t]), ("state_extra", tr.inventory[t]),
                          ("final_obs", tr.final_obs if last and not tr.terminated else "")):
            cols[name].append(val)


def _report(args, batch, truth, ses, wins, resets, seconds, games, max_steps) -> str:
    encoder = None
    if args.encoder == "minilm":
        from progpo.advantages.embeddings import default_encoder
        encoder = default_encoder()
    rng = np.random.default_rng(0)
    trajs = np.unique(batch.traj_id)
    rows = []
    base = config_base(max_steps, 0.95, 10.0)
    variants = select_variants(args.estimators.split(",") if args.estimators else None)
    ests = {v.name: compute_advantages(batch, v.config(base), encoder if v.needs_encoder else None).advantages
            for v in variants}
    for name, adv in ests.items():
        point = fidelity_metrics(adv, truth, args.sign_threshold)
        boot = {m: [] for m in METRICS}
        for _ in range(200):  # bootstrap over trajectories (the estimates stay fixed)
            pick = np.concatenate([np.flatnonzero(batch.traj_id == t) for t in rng.choice(trajs, len(trajs))])
            for m, v in fidelity_metrics(adv[pick], truth[pick], args.sign_threshold).items():
                boot[m].append(v)
        cells = [name]
        for m in METRICS:
            lo, hi = np.nanpercentile(boot[m], [2.5, 97.5]) if np.isfinite(boot[m]).any() else (np.nan, np.nan)
            cells.append(f"{point[m]:.3f} [{lo:.3f}, {hi:.3f}]")
        rows.append(cells)
    keys = [f"{u}\x1f{k}" for u, k in zip(batch.uid, batch.prefix_key)]
    _, inv, cnt = np.unique(np.asarray(keys, dtype=object), return_inverse=True, return_counts=True)
    later = batch.step_index > 0
    head = (f"ALFWorld {args.split} games {games}: {args.alf_rollouts} noisy-expert rollouts each (p = {args.p_expert}), "
            f"max {max_steps} steps, {batch.num_steps} steps, success {np.mean(wins):.2f}; truth from M = "
            f"{args.continuations} continuations per prefix ({resets} resets, {seconds:.0f} s). Truth standard error: "
            f"mean {np.mean(ses):.3f}, vs std of A* {np.std(truth):.3f}. Exact-prefix groups with >= 2 members at t > 0: "
            f"{np.mean(cnt[inv][later] >= 2) if later.any() else float('nan'):.3f}. Metrics: point value "
            f"[95% bootstrap over trajectories]; encoder: {args.encoder}.")
    return head + "\n\n" + report.markdown_table(["estimator", "sign agree", "Spearman", "Pearson", "NMSE"], rows)
