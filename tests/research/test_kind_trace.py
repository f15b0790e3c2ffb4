"""The per-kind trace: hand-checked kinds on a small batch, the same probes as the benchmark, one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from progpo.advantages import AdvantageConfig, StepBatch
from progpo.envs.synthetic.families import FAMILIES
from research import kind_trace
from research.fidelity_core import select_variants
from research.learner import RunSpec, build_source, make_context, train_run

# (uid, traj, t, obs, action, reward, terminated, truncated, invalid, prefix_key)
ROWS = [
    ("A", 1, 0, "room", "go desk", 0.0, False, False, False, "A0room"),
    ("A", 1, 1, "desk", "take pen", 0.0, False, False, False, "A1desk"),
    ("A", 1, 2, "desk+pen", "go shelf", 10.0, True, False, False, "A2pen"),
    ("A", 2, 0, "room", "go bed", 0.0, False, False, False, "A0room"),
    ("A", 2, 1, "bed", "jump", -0.1, False, False, True, "A1bed"),
    ("A", 2, 2, "bed", "look", 0.0, False, True, False, "A2bed"),
    ("A", 3, 0, "room", "go desk", 0.0, False, False, False, "A0room"),
    ("A", 3, 1, "desk", "take pen", 10.0, True, False, False, "A1desk"),
    ("B", 4, 0, "hall", "open door", 10.0, True, False, False, "B0hall"),
    ("B", 5, 0, "hall", "wait", 0.0, False, False, False, "B0hall"),
    ("B", 5, 1, "hall", "open door", 10.0, True, False, False, "B1hall"),
    ("C", 6, 0, "cave", "dig", 0.0, True, False, False, "C0cave"),
    ("C", 7, 0, "cave", "dig", 0.0, True, False, False, "C0cave"),
]
NAMES = ["a1t0", "a1t1", "a1t2", "a2t0", "a2t1", "a2t2", "a3t0", "a3t1", "b1t0", "b2t0", "b2t1", "c1t0", "c2t0"]
# By hand: peer groups "A0room" / "B0hall" / "C0cave" hold every trajectory of their task once at t = 0
# (rho = 0, spec (2)); "A1desk" has 2 members (rho > 0); the rest are singletons. Depth-0 pools (the
# observation within a task): room 3, desk 2, bed 2, hall 3, cave 2, desk+pen 1. Returns: A 10 / -0.1 / 10
# (a signal), B 10 / 10 (equal, won), C 0 / 0 (equal, lost).
EXPECTED = {
    "all": NAMES,
    "first step": ["a1t0", "a2t0", "a3t0", "b1t0", "b2t0", "c1t0", "c2t0"],
    "peer group >= 2": ["a1t1", "a3t1"],
    "credit, pool >= 2": ["a1t0", "a2t0", "a2t1", "a2t2", "a3t0", "b1t0", "b2t0", "b2t1", "c1t0", "c2t0"],
    "credit, singleton pool": ["a1t2"],
    "terminal": ["a1t2", "a3t1", "b1t0", "b2t1", "c1t0", "c2t0"],
    "truncated": ["a2t2"],
    "invalid": ["a2t1"],
    "equal-return task, won": ["b1t0", "b2t0", "b2t1"],
    "equal-return task, lost": ["c1t0", "c2t0"],
    "return-signal task": ["a1t0", "a1t1", "a1t2", "a2t0", "a2t1", "a2t2", "a3t0", "a3t1"],
}


def _batch(order) -> StepBatch:
    rows = [ROWS[k] for k in order]
    cols = ("uid", "traj_id", "step_index", "anchor_obs", "action", "reward", "terminated", "truncated", "invalid",
            "prefix_key")
    return StepBatch.from_lists(**{c: [r[i] for r in rows] for i, c in enumerate(cols)})


@pytest.mark.parametrize("order", [list(range(len(ROWS))), list(reversed(range(len(ROWS)))),
                                   [7, 0, 12, 3, 9, 1, 11, 5, 2, 10, 4, 8, 6]])
def test_step_kinds_by_hand_in_any_row_order(order):
    kinds = kind_trace.step_kinds(_batch(order), AdvantageConfig())
    assert list(kinds) == list(kind_trace.KINDS)
    names = [NAMES[k] for k in order]
    for kind, mask in kinds.items():
        assert sorted(n for n, m in zip(names, mask) if m) == sorted(EXPECTED[kind]), kind


def test_all_steps_spearman_is_the_benchmarks_on_policy_probe():
    fam = FAMILIES["alfworld"]
    src = build_source(fam, fam.learn_cfg, "fixed", "tabular", 3, 1, 12, 1)
    ctx = make_context(src, None)
    row = select_variants(["gigpo"])[0]
    run = train_run(ctx, RunSpec(row, 10.0, 2, 6, 4, probe_every=2))
    got = kind_trace.kind_trace(ctx, row, [row, select_variants(["progpo"])[0]], 10.0, [2], 6, 4, 2)
    assert got["gigpo"]["all"]["spearman"] == pytest.approx(float(np.mean(run.probes["spearman"])))
    assert got["gigpo"]["all"]["share"] == 1.0
    for name in ("gigpo", "progpo"):
        parts = sum(got[name][k]["share"] for k in ("equal-return task, won", "equal-return task, lost",
                                                     "return-signal task"))
        assert parts == pytest.approx(1.0)
    assert "| first step |" in kind_trace.table(got)


def test_main_prints_the_table_and_refuses_bad_flags(capsys):
    argv = ["--family", "alfworld", "--regime", "fixed", "--train.num_iterations", "3", "--rollout.batch_size", "2",
            "--rollout.n_samples_per_prompt", "4", "--every", "2", "--seeds", "1", "--rows", "gigpo,g2po"]
    assert kind_trace.main(argv) == 0
    out = capsys.readouterr().out
    assert "**Advantage against A* by kind of step**" in out and "Spearman (g2po)" in out
    assert kind_trace.main(["--lr", "0"]) == 2
    assert kind_trace.main(["--every", "0"]) == 2
    assert kind_trace.main(["--rows", "oracle"]) == 2
    assert kind_trace.main(["--path_row", "nope"]) == 2
    assert "error: " in capsys.readouterr().err
