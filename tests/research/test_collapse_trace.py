"""The collapse trace replays the benchmark's own runs and prints its three tables; bad flags are one line."""

from __future__ import annotations

import numpy as np
import pytest

from research import collapse_trace, learning
from progpo.envs.synthetic.families import FAMILIES
from research.fidelity_core import select_variants
from research.learner import RunSpec, build_source, make_context, train_run


def test_trace_replays_the_benchmark_run():
    fam = FAMILIES["alfworld"]
    src = build_source(fam, fam.learn_cfg, "fixed", "tabular", 3, 1, 12, 1)
    ctx = make_context(src, None)
    row = select_variants(["progpo semantic_expansion=false"])[0]
    run = train_run(ctx, RunSpec(row, 10.0, 3, 6, 4))
    lines, escapes = collapse_trace.trace(ctx, row, 10.0, 3, 6, 4, select_variants(["grpo"]), escape_at=3,
                                          escape_with=[select_variants(["grpo"])[0], None])
    assert [float(x[1]) for x in lines] == pytest.approx(np.round(run.success, 2).tolist())
    assert set(escapes) == {"grpo", "oracle"} and all(len(v) == 3 for v in escapes.values())
    sizes = collapse_trace.sizes(ctx, row, [row, None], 10.0, 1, 2, 4)
    # the oracle's update projects entirely on the exact gradient's direction: projection = norm
    assert sizes["oracle"][1] == pytest.approx(sizes["oracle"][0])


def test_main_prints_the_tables_and_refuses_bad_flags(capsys):
    argv = ["--family", "alfworld", "--regime", "fixed", "--train.num_iterations", "4", "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "4",
            "--row", "progpo semantic_expansion=false", "--compare", "hgpo", "--escape_at", "2",
            "--escape_with", "grpo,oracle", "--sizes_seeds", "1", "--sizes_iterations", "2", "--workers", "1"]
    assert collapse_trace.main(argv) == 0
    out = capsys.readouterr().out
    assert "**Trace**" in out and "**Escape**" in out and "**Update size**" in out and "| oracle |" in out
    assert collapse_trace.main(["--lr", "0"]) == 2
    assert collapse_trace.main(["--escape_at", "100"]) == 2
    assert collapse_trace.main(["--row", "nope"]) == 2
    assert "error: " in capsys.readouterr().err


def test_a_task_preset_traces_the_preset_s_tasks(capsys):
    """With ``--task_preset hard`` the trace replays the run the benchmark makes on the hard tasks (the same
    success per iteration as ``train_run`` on a source built from the preset), not one on the default tasks."""
    argv = ["--family", "webshop", "--regime", "fresh", "--task_seed", "1", "--task_preset", "hard",
            "--task_config", "n_items=9", "--train.num_iterations", "3", "--train.seed", "2",
            "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "4", "--row", "gigpo", "--lr", "5",
            "--compare", "grpo", "--workers", "1"]
    assert collapse_trace.main(argv) == 0
    out = capsys.readouterr().out
    assert "preset hard, task config n_items=9" in out
    cells = [line.split("|") for line in out.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    success, length = [float(c[2]) for c in cells], [float(c[6]) for c in cells]
    fam = FAMILIES["webshop"]
    cfg = learning.lab_task_config("webshop", "hard", "n_items=9")
    assert cfg.n_items == 9 and cfg.win_only and cfg != fam.learn_cfg
    src = build_source(fam, cfg, "fresh", "features", 2, 1, 6, 1)
    run = train_run(make_context(src, None), RunSpec(select_variants(["gigpo"])[0], 5.0, 2, 3, 4))
    assert success == pytest.approx(np.round(run.success, 2).tolist())
    # the episode lengths tell the preset's tasks from the default ones, where success alone (0 at the start) cannot
    assert length == pytest.approx(np.round(np.diff(run.steps, prepend=0) / (2 * 4), 1).tolist())


@pytest.mark.parametrize("flags, named", [(["--task_preset", "hrad"], "--task_preset"),
                                          (["--task_config", "n_items"], "--task_config"),
                                          (["--task_config", "no_such_field=1"], "--task_config")])
def test_bad_task_flags_are_one_line_naming_the_flag(capsys, flags, named):
    assert collapse_trace.main(["--family", "webshop", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err
