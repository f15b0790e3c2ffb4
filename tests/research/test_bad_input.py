"""Bad input to the lab commands is refused by name before any work: empty comma-list entries, unknown rows and
families, negative seeds and thresholds, an output folder that is a file, --write_docs with --quick, a prefix of a
flag; learning_report answers a bad flag or runs file with one line (it printed a traceback)."""

from __future__ import annotations

import pickle

import pytest

from research import collapse_trace, fidelity, kind_trace, learning, learning_lm, learning_report


@pytest.mark.parametrize("module, argv, words", [
    (fidelity, ["--n_rollouts", "4,,8"], "--n_rollouts has an empty entry"),
    (fidelity, ["--estimators", "progpo,nope"], "--estimators: row 'nope'"),
    (fidelity, ["--estimators", ""], "--estimators must name at least one row"),
    (fidelity, ["--family", "nope"], "--family: unknown task family 'nope'"),
    (fidelity, ["--mode", "alfworld", "--games", "a,b"], "--games must be a comma list"),
    (fidelity, ["--train.seed", "-1"], "--train.seed must be >= 0"),
    (fidelity, ["--write_docs", "--quick"], "--write_docs: a --quick run"),
    (learning, ["--lr_sweep", "1,,2"], "--lr_sweep has an empty entry"),
    (learning, ["--lr_sweep", "inf"], "--lr_sweep rates must be finite numbers > 0"),
    (learning, ["--reference", "gigp0"], "--reference: row 'gigp0'"),
    (learning, ["--task_config", "nope=1"], "--task_config: alfworld config has no field 'nope'"),
    (learning, ["--sign_threshold", "-1"], "--sign_threshold must be >= 0"),
    (learning, ["--task_seed", "-1"], "--task_seed must be >= 0"),
    (learning, ["--write_docs", "--quick"], "--write_docs: a --quick run"),
    (learning_lm, ["--envs", "alfworld_like,,webshop_like"], "--envs has an empty entry"),
    (kind_trace, ["--rows", ""], "--rows must name at least one row"),
    (kind_trace, ["--path_row", ""], "--path_row must name one row"),
    (collapse_trace, ["--row", ""], "--row must name one row"),  # was an IndexError
    (collapse_trace, ["--compare", "progpo,,gigpo"], "--compare has an empty entry"),
    (learning, ["--workers", "100000"], "--workers must be <= "),  # each a forked process, all started at once
    (kind_trace, ["--workers", "100000"], "--workers must be <= "),
])
def test_bad_input_is_refused_by_name(module, argv, words):
    with pytest.raises(ValueError) as exc:
        module.parse_args(argv)
    assert str(exc.value).startswith(words), exc.value


@pytest.mark.parametrize("module", [fidelity, learning, learning_lm])
def test_an_output_folder_that_is_a_file_is_refused_before_the_run(module, tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="--out .* is a file; choose a folder"):
        module.parse_args(["--out", str(tmp_path / "f")])


def test_a_prefix_of_a_lab_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        fidelity.main(["--est", "progpo"])  # was --estimators progpo
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and "unrecognized arguments: --est progpo" in err[0] and len(err) == 2


@pytest.mark.parametrize("make, argv, words", [
    (None, ["--target", "nan"], "--target must be a finite number"),
    (None, [], "No such file or directory"),
    (b"not a pickle", [], "is no learning run's *-runs.pkl"),
    ({"final": {"progpo": []}}, ["--references", "nope"], "--references: reference rows ['nope']"),
    ({"final": {"progpo": []}}, ["--references", "gigpo,,hgpo"], "--references has an empty entry"),
])
def test_learning_report_bad_input_is_one_line(make, argv, words, tmp_path, capsys):
    runs = tmp_path / "x-runs.pkl"
    if make is not None:
        runs.write_bytes(make if isinstance(make, bytes) else pickle.dumps(make))
    assert learning_report.main(["--runs", str(runs), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m research.learning_report: error:") and words in err[0], err
