"""Every grouping key is per task: two tasks that share a prompt (and observations, actions) never
become each other's peers.

In a real batch one task can be drawn twice under two uids, and two tasks can render the same prompt
(same instruction text, same first page). Every other advantage test builds its prefix keys with the
uid inside, so a peer key that dropped the task would pass them all.
"""

from __future__ import annotations

import dataclasses
from math import sqrt

import numpy as np
import pytest

from progpo.advantages import ESTIMATORS, PRESETS, AdvantageConfig, compute_advantages, config_from_preset
from progpo.advantages.batch import StepBatch


def _batch(rows) -> StepBatch:
    """rows: (uid, traj, t, obs, action, reward, terminated, prefix_key)."""
    return StepBatch.from_lists(
        uid=[r[0] for r in rows], traj_id=[r[1] for r in rows], step_index=[r[2] for r in rows],
        anchor_obs=[r[3] for r in rows], action=[r[4] for r in rows], reward=[r[5] for r in rows],
        terminated=[r[6] for r in rows], truncated=[False] * len(rows), invalid=[False] * len(rows),
        prefix_key=[r[7] for r in rows], state_extra=[f"carrying {r[2]}" for r in rows],
    )


def test_progpo_peer_group_keeps_the_task_apart_hand_case():
    """Tasks A (returns 1, 0) and B (returns 3, 0), one step each, all four under ONE prompt.

    Per task the peer group is {both trajectories of the task at t = 0}, which only repeats the episode
    term and is skipped (rho = 0). So A = A^E: (1 - 0.5) / (stdev(1, 0) + eps) = 0.5 / (1/sqrt 2) =
    +-0.707106 in A and (3 - 1.5) / (3/sqrt 2) = +-0.707106 in B, and no peer term is used.
    A peer key without the task pools the four (G = 1, 0, 3, 0: mean 1, stdev sqrt 2, rho = 3/4) and
    gives 0.707 + 0.75 * (-1/sqrt 2) = -1.237 for A's second trajectory.
    """
    rows = [("A", 0, 0, "shop", "search[x]", 1.0, True, "P"), ("A", 1, 0, "shop", "search[y]", 0.0, True, "P"),
            ("B", 2, 0, "shop", "search[x]", 3.0, True, "P"), ("B", 3, 0, "shop", "search[y]", 0.0, True, "P")]
    cfg = AdvantageConfig(estimator="progpo", use_potential=False, kappa=1.0, credit_lambda=0.0)
    out = compute_advantages(_batch(rows), cfg)
    want = 0.5 / (1 / sqrt(2) + cfg.eps)
    np.testing.assert_allclose(out.advantages, [want, -want, want, -want], atol=1e-6)
    assert abs(want - 0.707106) < 1e-6
    assert out.diagnostics["adv/frac_peer_used"] == 0.0


# Two tasks with identical texts at every step (same prompts, observations, actions), different returns.
def _twin_rows(uid: str, traj0: int, returns: list[float]) -> list[tuple]:
    rows = []
    for k, ret in enumerate(returns):
        traj = traj0 + k
        path = ["room", "desk" if k % 2 == 0 else "bed", "shelf"]
        acts = ["go desk" if k % 2 == 0 else "go bed", "go shelf", "take pen"]
        for t in range(3):
            key = ">".join(path[: t + 1])  # the prompt: history, never the uid
            rows.append((uid, traj, t, path[t], acts[t], ret if t == 2 else 0.0, t == 2, key))
    return rows


A_RETURNS = [10.0, 0.0, 10.0, 0.0]
B_RETURNS = [0.0, 10.0, 0.0, 0.0]


@pytest.mark.parametrize("name", sorted(ESTIMATORS) + [f"preset:{p}" for p in PRESETS])
@pytest.mark.parametrize("prefix_mode", ["prompt", "history"])
def test_two_tasks_sharing_every_text_get_their_own_advantages(name, prefix_mode):
    """For every estimator (and preset): a batch of two tasks that share every prompt, observation and
    action gives each task exactly the advantages it gets alone (every group-by is within the task).

    ``rms_cap`` is off here: it rescales the whole batch by design, so it is not per task."""
    if name.startswith("preset:"):
        cfg = config_from_preset(name.split(":", 1)[1])
    else:
        cfg = AdvantageConfig(estimator=name, zero_signal="off")
    cfg = dataclasses.replace(cfg, prefix_mode=prefix_mode, rms_cap=0.0)
    rows_a, rows_b = _twin_rows("A", 0, A_RETURNS), _twin_rows("B", 10, B_RETURNS)
    both = compute_advantages(_batch(rows_a + rows_b), cfg).advantages
    alone = np.concatenate([compute_advantages(_batch(rows_a), cfg).advantages,
                            compute_advantages(_batch(rows_b), cfg).advantages])
    np.testing.assert_allclose(both, alone, rtol=0, atol=1e-12)
    assert np.abs(alone).max() > 0.1  # the batch carries signal, so a mixed-up group would show
