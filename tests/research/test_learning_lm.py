"""``bench learning-lm``: the estimator comparison with the transformer policy and the product's trainer.

Fast tests check what the bench hands the trainer (each row's estimator settings arrive through the
``train`` flags unchanged) and its flag errors; the slow one runs the whole pipeline (warm start by the
``sft`` command, sweep, final runs, tables) at toy size.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from research import learning_lm
from research.learning import parse_rows
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
    (["--seeds", "0"], "--seeds"), (["--rollout.n_samples_per_prompt", "1"], "--rollout.n_samples_per_prompt"), (["--lr_sweep", "1e-3,x"], "--lr_sweep"),
    (["--lr_sweep", "0"], "--lr_sweep"), (["--envs", "webshop"], "--envs"), (["--target", "1.5"], "--target"),
    (["--pool", "-1"], "--pool"), (["--pool", "0"], "--regime fresh"), (["--regime", "fresh", "--pool", "3"], "--pool"),
    (["--env.history_length", "-1"], "--env.history_length"), (["--sft.lr", "0"], "--sft.lr"), (["--estimators", "nope"], "--estimators"),
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
    argv = ["--envs", "alfworld_like", "--estimators", "grpo,progpo", "--lr_sweep", "1e-3", "--seeds", "2",
            "--train.num_iterations", "2", "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2",
            "--pool", "2", "--env.max_steps", "8", "--sft.num_tasks", "8", "--sft.max_epochs", "1", "--workers", "1", "--out", str(out)]
    assert learning_lm.main(argv) == 0
    text = capsys.readouterr().out
    for part in ("**Learning-rate sweep**", "**Learning**", "warm-start success", "collapsed", "Cost:",
                 "No oracle row"):
        assert part in text, part
    runs = pickle.loads((out / "learning-lm-it2-runs.pkl").read_bytes())  # a budget of its own: its own block
    final = runs["alfworld_like"]["final"]
    assert set(final) == {"grpo", "progpo"}
    assert all(len(r.success) == 2 and r.steps[-1] > 0 for rs in final.values() for r in rs)
    assert sorted(r.spec.seed for r in final["grpo"]) == [0, 1]


def test_fresh_and_fixed_task_reports_have_their_own_block():
    assert learning_lm.block_name("fresh") == "learning-lm-fresh"
    assert learning_lm.block_name("fixed") == learning_lm.block_name("fixed", 16) == "learning-lm"
    assert learning_lm.block_name("fresh", 64) == "learning-lm-fresh-it64"  # another budget, another block
    with pytest.raises(ValueError, match="regime"):
        learning_lm.block_name("0")


def test_fresh_tasks_default_to_their_own_folder():
    """A shared folder would let one regime's runs remove the other's as stale (_cached)."""
    assert learning_lm.parse_args(["--regime", "fresh"]).out == "runs/bench/learning-lm-fresh"
    assert learning_lm.parse_args([]).out == "runs/bench/learning-lm"
    assert learning_lm.parse_args(["--regime", "fresh", "--out", "x"]).out == "x"
    assert learning_lm.parse_args(["--regime", "fresh", "--train.num_iterations", "64"]).out == "runs/bench/learning-lm-fresh-it64"


def test_each_regime_has_its_own_defaults_and_a_flag_wins():
    """Fresh tasks need a warm start that clones the family (1,600 tasks, 8 epochs), not 170 tasks' episodes."""
    fixed, fresh = learning_lm.parse_args([]), learning_lm.parse_args(["--regime", "fresh"])
    assert (fixed.pool, fixed.tasks, fixed.rollouts, fixed.sft_tasks, fixed.sft_epochs) == (2, 2, 16, 170, 1)
    assert (fresh.pool, fresh.tasks, fresh.rollouts, fresh.sft_tasks, fresh.sft_epochs) == (0, 4, 8, 1600, 8)
    assert fixed.lrs == [1e-3, 2e-3] and fresh.lrs == [3e-4, 1e-3]
    mine = learning_lm.parse_args(["--regime", "fresh", "--sft.num_tasks", "64", "--rollout.batch_size", "2"])
    assert (mine.sft_tasks, mine.tasks, mine.sft_epochs) == (64, 2, 8)
    assert learning_lm.parse_args(["--rollout.batch_size", "3"]).pool == 3  # the fixed pool follows the batch
    given = learning_lm.parse_args(["--regime", "fresh", "--rollout.batch_size", "3", "--rollout.n_samples_per_prompt",
                                    "4", "--train.num_iterations", "5", "--env.max_steps", "6", "--env.history_length",
                                    "0", "--sft.num_tasks", "7", "--sft.max_epochs", "2", "--sft.lr", "1e-2",
                                    "--algo.kl.init_coef", "0.1"])
    assert (given.tasks, given.rollouts, given.iterations, given.max_steps, given.history, given.sft_tasks,
            given.sft_epochs, given.sft_lr, given.kl, given.lrs) == (3, 4, 5, 6, 0, 7, 2, 1e-2, 0.1, [3e-4, 1e-3])


def test_the_fresh_warm_start_is_the_command_whose_clone_reads_the_family(monkeypatch, tmp_path):
    """The fresh regime's warm start sums each batch of 8 over micro-batches of 2 (the sft command's default):
    that command's clone copies receptacle numbers, the one with one micro-batch of 8 stalled before it did
    (FRESH_CLONE_NOTE). The fixed regime keeps 8, as its block was made. The flag reaches the sft command."""
    import subprocess

    fixed, fresh = learning_lm.parse_args([]), learning_lm.parse_args(["--regime", "fresh"])
    assert (fixed.sft_micro_batch, fresh.sft_micro_batch) == (8, 2)
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        raise RuntimeError("stop here")

    monkeypatch.setattr(subprocess, "run", fake_run)
    for args, micro in ((fresh, "2"), (fixed, "8")):
        with pytest.raises(RuntimeError, match="stop here"):
            learning_lm.sft_job("alfworld_like", str(tmp_path / "sft"), learning_lm._settings(args))
        cmd = seen["cmd"]
        assert cmd[cmd.index("--train.micro_batch_size") + 1] == micro
        assert cmd[cmd.index("--sft.batch_size") + 1] == "8"


def test_the_paired_gap_compares_second_halves_seed_by_seed():
    from types import SimpleNamespace

    def run(seed, succ):
        s = np.asarray(succ, dtype=float)
        return learning_lm.LMRunResult(SimpleNamespace(seed=seed), np.arange(1, s.size + 1) * 10.0, s,
                                       np.zeros(0, np.int64), {}, 0.0)

    a = [run(0, [0.0, 0.0, 0.5, 0.7]), run(1, [0.0, 0.0, 0.2, 0.2]), run(2, [0.1, 0.1, 0.1, 0.1])]
    ref = [run(1, [0.9, 0.9, 0.1, 0.1]), run(0, [0.0, 0.0, 0.2, 0.4])]
    assert learning_lm.late_success(a[0]) == pytest.approx(0.6)  # iterations 3-4 of 4
    assert learning_lm.late_success(run(0, [0.0, 0.3, 0.6])) == pytest.approx(0.45)  # 3 // 2 = 1: iterations 2-3
    assert learning_lm.paired_gap(a, ref) == pytest.approx([0.3, 0.1])  # seed 2 has no partner
    table = learning_lm.detail_table({"ref": ref, "a": a[:2]}, {"ref": 1e-3, "a": 1e-3}, "ref")
    assert "second-half success - ref's, paired by seed" in table.splitlines()[0]
    assert "| 0.200 ± 1.271 |" in table  # mean of [0.3, 0.1], t(0.975, 1) * sd 0.1414 / sqrt 2


def test_the_help_shows_each_regime_s_defaults_from_regime_defaults(capsys):
    """Beside each flag the help shows fixed's default; --regime's help lists what each regime sets, read from
    REGIME_DEFAULTS."""
    with pytest.raises(SystemExit):
        learning_lm.parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--rollout.batch_size N tasks (groups) per iteration (default: 2)" in shown
    assert "--sft.num_tasks 1600" in shown and "--lr_sweep 3e-4,1e-3" in shown and "--rollout.batch_size 4" in shown


def test_the_regime_defaults_follow_regime_defaults(monkeypatch):
    """The regime's defaults and --regime's help are read from REGIME_DEFAULTS, so a changed default cannot leave
    the help or the run behind."""
    changed = {regime: {**defaults, "lr_sweep": f"{i + 7}e-4", "sft_tasks": 11 + i}
               for i, (regime, defaults) in enumerate(learning_lm.REGIME_DEFAULTS.items())}
    monkeypatch.setattr(learning_lm, "REGIME_DEFAULTS", changed)
    assert "fixed: --rollout.batch_size 2" in learning_lm.regime_help() and "--lr_sweep 8e-4" in learning_lm.regime_help()
    fresh = learning_lm.parse_args(["--regime", "fresh"])
    assert (fresh.lrs, fresh.sft_tasks) == ([8e-4], 12)
