"""The flag generator's shared refusals (progpo.run.flags): every parser it builds takes no prefix of a flag and
answers a bad flag with one error line and one hint (no usage dump); comma lists refuse empty entries; output
paths are checked before the run, not after it; seeds are never negative."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from progpo.run import flags
from progpo.run.settings import EvalSettings, TrainSettings


@dataclass(frozen=True)
class _Args:
    estimators: str = "progpo"
    """rows"""
    lr_sweep: str = ""
    """rates"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m some cmd")
    flags.add_flags(p, _Args)
    return p


@pytest.mark.parametrize("argv", [["--est", "gigpo"], ["--lr", "1"]])
def test_a_prefix_of_a_flag_is_no_flag(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and err[0] == f"python -m some cmd: error: unrecognized arguments: {' '.join(argv)}"


def test_an_old_spelling_is_one_line_with_a_did_you_mean(capsys):
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["--lr-sweep", "1,2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 2 and "usage:" not in "\n".join(err), err
    assert "unrecognized arguments: --lr-sweep" in err[0] and "did you mean --lr_sweep" in err[1]


@pytest.mark.parametrize("text", ["1,,2", "1,", ",", " , 2"])
def test_a_comma_list_refuses_an_empty_entry(text):
    with pytest.raises(ValueError, match=r"^--lr_sweep has an empty entry"):
        flags.comma_list(text, "--lr_sweep")


def test_a_comma_list_strips_and_keeps_order():
    assert flags.comma_list(" b, a ,c", "--x") == ["b", "a", "c"]
    assert flags.comma_list("", "--x") == [] and flags.comma_list(None, "--x") == []


def test_an_output_path_is_checked_before_the_run(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("")
    with pytest.raises(ValueError, match="--out .* is a file"):
        flags.check_writable(str(a_file), "--out")
    with pytest.raises(ValueError, match="--out .* lies under .*, which is a file"):
        flags.check_writable(str(a_file / "sub"), "--out")
    with pytest.raises(ValueError, match="--json_out .* is a folder"):
        flags.check_writable(str(tmp_path), "--json_out", folder=False)
    with pytest.raises(ValueError, match="--out must name a folder"):
        flags.check_writable("", "--out")
    flags.check_writable(str(tmp_path / "new" / "deeper"), "--out")  # to be made: fine
    flags.check_writable(None, "--json_out", folder=False)  # no output: fine


def test_seeds_are_not_negative():
    # numpy's generators refuse a negative seed deep inside a run (a traceback after the setup)
    with pytest.raises(ValueError, match=r"^--train.seed must be >= 0, got -1$"):
        TrainSettings(seed=-1)
    with pytest.raises(ValueError, match=r"^--eval.seed must be >= 0, got -1$"):
        EvalSettings(seed=-1)


@pytest.mark.parametrize("argv, hint", [
    (["--advantage_estimator", "progpo"], "did you mean --algo.advantage.estimator"),  # the removed alias
    (["--algo.advantage.estimator", "gae"], "grep -A2 -- '--algo.advantage.estimator'"),
    (["--algo.advantage.est", "progpo"], "did you mean --algo.advantage.estimator"),
])
def test_train_answers_a_bad_estimator_flag_in_one_line_and_a_hint(argv, hint, capsys):
    # it printed argparse's usage of every flag (about 100 lines) above the error
    from progpo.trainer.config import config_from_args

    with pytest.raises(SystemExit) as exc:
        config_from_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 2, err
    assert err[0].startswith("python -m progpo.cli.train: error:") and hint in err[1], err
