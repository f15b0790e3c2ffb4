"""``bench learning-lm``: the estimator comparison with the transformer policy and the product's trainer.

Fast tests check what the bench hands the trainer (each row's estimator settings arrive through the
``train`` flags unchanged) and its flag errors; the slow one runs the whole pipeline (warm start by the
``sft`` command, sweep, final runs, tables) at toy size.
"""

from __future__ import annotations

import pickle

import pytest

from progpo.lab import learning_lm
from progpo.lab.learning import parse_rows
from progpo.trainer.config import config_from_args


@pytest.mark.parametrize("row", parse_rows(",".join(learning_lm.DEFAULT_ROWS)), ids=lambda r: r.name)
def test_each_row_reaches_the_trainer_with_its_own_estimator_settings(row, tmp_path):
    args = learning_lm._settings(learning_lm.parse_args([]))
    cfg = config_from_args(learning_lm.train_flags("webshop_like", "tiny-agent", row, 3e-4, 0, args, str(tmp_path)))
    assert cfg.progpo == row.config({"max_steps": args["max_steps"]})
    assert cfg.env.num_tasks == args["pool"] and cfg.env.history_length == args["history"]
    assert cfg.actor.adam.lr == 3e-4 and cfg.train.seed == 0


def test_the_paper_preset_row_differs_from_the_default():
    default, paper = parse_rows("progpo,progpo preset=paper")
    assert default.config({}) != paper.config({})
    assert paper.config({}).rms_cap == 0.0 and default.config({}).rms_cap == 1.0


@pytest.mark.parametrize("argv, flag", [
    (["--seeds", "0"], "--seeds"), (["--rollouts", "1"], "--rollouts"), (["--lr-sweep", "1e-3,x"], "--lr-sweep"),
    (["--lr-sweep", "0"], "--lr-sweep"), (["--envs", "webshop"], "--envs"), (["--target", "1.5"], "--target"),
    (["--pool", "-1"], "--pool"), (["--history", "-1"], "--history"), (["--estimators", "nope"], "--estimators"),
])
def test_bad_flags_name_the_flag(argv, flag):
    with pytest.raises(ValueError, match=flag):
        learning_lm.parse_args(argv)


def test_the_oracle_row_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="cannot be computed"):
        learning_lm.parse_args(["--estimators", "grpo,oracle"])


def test_main_prints_one_line_on_bad_flags(capsys):
    assert learning_lm.main(["--seeds", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seeds" in err[0]


@pytest.mark.slow
def test_the_pipeline_runs_at_toy_size(tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["--envs", "alfworld_like", "--estimators", "grpo,progpo", "--lr-sweep", "1e-3", "--seeds", "2",
            "--iterations", "2", "--tasks", "2", "--rollouts", "2", "--pool", "2", "--max-steps", "8",
            "--sft-tasks", "8", "--sft-epochs", "1", "--workers", "1", "--out", str(out)]
    assert learning_lm.main(argv) == 0
    text = capsys.readouterr().out
    for part in ("**Learning-rate sweep**", "**Learning**", "warm-start success", "collapsed", "Cost:",
                 "No oracle row"):
        assert part in text, part
    runs = pickle.loads((out / "learning-lm-runs.pkl").read_bytes())
    final = runs["alfworld_like"]["final"]
    assert set(final) == {"grpo", "progpo"}
    assert all(len(r.success) == 2 and r.steps[-1] > 0 for rs in final.values() for r in rs)
    assert sorted(r.spec.seed for r in final["grpo"]) == [0, 1]


def test_fresh_and_fixed_task_reports_have_their_own_block():
    assert learning_lm.block_name(0) == "learning-lm-fresh"
    assert learning_lm.block_name(2) == learning_lm.block_name(16) == "learning-lm"


def test_fresh_tasks_default_to_their_own_folder():
    """A shared folder would let one regime's runs remove the other's as stale (_cached)."""
    assert learning_lm.parse_args(["--pool", "0"]).out == "runs/bench/learning-lm-fresh"
    assert learning_lm.parse_args([]).out == "runs/bench/learning-lm"
    assert learning_lm.parse_args(["--pool", "0", "--out", "x"]).out == "x"
