"""Evaluation: play fixed test tasks with a model and summarise success with 95% confidence intervals.

Summaries (all with 95% intervals): success rate (Wilson score interval; Wilson 1927), mean episode
return and, for WebShop, mean score (normal interval ``mean +- 1.96 * sd / sqrt(n)``); for ALFWorld,
success per task type (Pick, Look, Clean, Heat, Cool, Pick2), as the papers' tables report.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from progpo.agents.types import Episode
from progpo.envs.alfworld import wilson_interval
from progpo.envs.spec import spec


def mean_interval(values: Sequence[float], confidence: float = 0.95, *, student_t: bool = False) -> dict[str, float]:
    """``{"mean", "low", "high", "n"}``: the interval of the mean, ``mean +- q * sd / sqrt(n)`` with ``sd`` the
    sample standard deviation (``n - 1`` in the denominator); nan bounds when n < 2, nan mean too when n = 0.
    Units: those of ``values``.

    ``q`` is the normal quantile ``z_{(1 + confidence) / 2}`` (1.96 at 95%: the normal approximation, for many
    episodes), or with ``student_t`` Student's ``t_{n-1}`` quantile ("Student" 1908, "The probable error of a
    mean", Biometrika 6), the exact interval for normal values, which a handful of seeds needs: 4.30 at n = 3
    against 1.96.
    """
    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "n": 0}
    mean = float(x.mean())
    if n < 2:
        return {"mean": mean, "low": math.nan, "high": math.nan, "n": n}
    if student_t:
        from scipy.stats import t

        q = float(t.ppf((1 + confidence) / 2, n - 1))
    else:
        q = NormalDist().inv_cdf((1 + confidence) / 2)
    half = q * float(x.std(ddof=1)) / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def mean_difference_interval(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """``{"diff", "low", "high"}``: the difference of two independent means ``a["mean"] - b["mean"]`` with the
    normal-approximation interval of :func:`mean_interval` (the unpooled standard error of Welch 1947, "The
    generalization of 'Student's' problem when several different population variances are involved", Biometrika 34,
    with the normal quantile in place of Student's t):

        diff +- sqrt(h_a^2 + h_b^2),   h = (high - low) / 2 = z * sd / sqrt(n) of each interval

    so it is computed from two :func:`mean_interval` results at the same confidence, and equals
    ``z * sqrt(var_a / n_a + var_b / n_b)`` around the difference. Units: those of the means (e.g. WebShop score).

    Raises:
        ValueError: an interval is missing or nan (fewer than 2 values).
    """
    half = []
    for x, name in ((a, "a"), (b, "b")):
        low, high = x.get("low"), x.get("high")
        if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"interval of the mean {name} is missing (n = {x.get('n')}; at least 2 values needed)")
        half.append((high - low) / 2)
    d = a["mean"] - b["mean"]
    h = math.hypot(*half)
    return {"diff": d, "low": d - h, "high": d + h}


def rate_interval(wins: int, n: int, confidence: float = 0.95) -> dict[str, float]:
    """``{"rate", "low", "high", "n", "wins"}`` with the Wilson score interval."""
    low, high = wilson_interval(wins, n, confidence)
    return {"rate": wins / n if n else math.nan, "low": low, "high": high, "n": n, "wins": wins}


def rate_difference_interval(wins_a: int, n_a: int, wins_b: int, n_b: int,
                             confidence: float = 0.95) -> dict[str, float]:
    """``{"diff", "low", "high"}``: the difference of two success rates ``wins_a/n_a - wins_b/n_b`` with
    Newcombe's hybrid score interval (Newcombe 1998, "Interval estimation for the difference between
    independent proportions", method 10), built from the two Wilson intervals ``(l_a, u_a)``, ``(l_b, u_b)``:

        low  = d - sqrt((p_a - l_a)^2 + (u_b - p_b)^2)
        high = d + sqrt((u_a - p_a)^2 + (p_b - l_b)^2)

    Episodes are the independent units (on a fixed set of tasks the per-task mix only lowers the variance).

    Raises:
        ValueError: ``n_a`` or ``n_b`` < 1, or wins outside ``[0, n]``.
    """
    for wins, n, name in ((wins_a, n_a, "a"), (wins_b, n_b, "b")):
        if n < 1 or not 0 <= wins <= n:
            raise ValueError(f"rate {name}: need 0 <= wins <= n and n >= 1, got wins={wins}, n={n}")
    pa, pb = wins_a / n_a, wins_b / n_b
    la, ua = wilson_interval(wins_a, n_a, confidence)
    lb, ub = wilson_interval(wins_b, n_b, confidence)
    d = pa - pb
    return {"diff": d, "low": d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2),
            "high": d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)}


def webshop_summary(episodes: list[Episode]) -> dict[str, Any]:
    """WebShop's spec ``summary``: the mean score with a 95% interval."""
    return {"score": mean_interval([float(ep.info.get("score", 0.0)) for ep in episodes])}


def summarize(env_name: str, episodes: list[Episode]) -> dict[str, Any]:
    """The JSON-ready summary of finished evaluation episodes (failed ones counted separately)."""
    done = [ep for ep in episodes if not ep.failed]
    out: dict[str, Any] = {
        "env": env_name,
        "episodes": len(episodes),
        "failed_episodes": len(episodes) - len(done),
        "success": rate_interval(sum(ep.won for ep in done), len(done)),
        "return": mean_interval([ep.episode_return for ep in done]),
        "episode_length": mean_interval([len(ep.steps) for ep in done]),
        "invalid_action_frac": float(np.mean([s.invalid for ep in done for s in ep.steps])) if done else math.nan,
        "format_invalid": rate_interval(sum(s.format_invalid for ep in done for s in ep.steps),
                                        sum(len(ep.steps) for ep in done)),
    }
    env_spec = spec(env_name)
    if env_spec.summary is not None:
        out.update(env_spec.load("summary")(done))
    return out


def play_split(env_settings, rollout, model_path: str, *, split: str, num_tasks: int | None, n_samples: int,
               sampling, progress: bool = True, task_offset: int = 0) -> tuple[list[Episode], int]:
    """Play tasks ``task_offset..task_offset+num_tasks-1`` of ``split`` (to its end when None) ``n_samples``
    times each, with the ``--env.*`` settings ``env_settings`` (resolved) and the ``--rollout.*`` settings
    ``rollout`` (context guard ``max_prompt_tokens``, generation batch ``gen_batch_size``).

    A progress bar (stderr, finished episodes with an ETA) runs unless ``progress`` is False.

    Returns:
        ``(episodes, tasks_in_split)``.

    Raises:
        ValueError: ``task_offset`` beyond the split (names ``--eval.task_offset``).
    """
    import sys

    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from progpo.agents.episode import EpisodeConfig, TaskSpec, run_episodes
    from progpo.run.env_setup import open_env_pool
    from progpo.run.generation import HFGenerator

    tok = AutoTokenizer.from_pretrained(model_path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    gen = HFGenerator(model, tok, max_batch_size=rollout.gen_batch_size, seed=sampling.seed or 0)
    with open_env_pool(env_settings, max_envs=64) as envs:
        total = envs.num_tasks(split)
        if not 0 <= task_offset < total:
            raise ValueError(f"--eval.task_offset must be in [0, {total}) for split {split!r}, got {task_offset}")
        n = total - task_offset if num_tasks is None else min(num_tasks, total - task_offset)
        tasks = [TaskSpec(split, task_offset + i) for i in range(n)]
        bar = tqdm(total=n * n_samples, desc=f"evaluate {split}", unit="ep", disable=not progress, file=sys.stderr)
        try:
            cfg = EpisodeConfig(env=env_settings, rollout=rollout, sampling=sampling, n_samples_per_task=n_samples,
                                max_concurrency=64)
            episodes = asyncio.run(run_episodes(tasks, cfg, env_pool=envs.pool, generate=gen, tokenizer=tok,
                                                on_episode_end=lambda ep: bar.update(1)))
        finally:
            bar.close()
    return episodes, total
