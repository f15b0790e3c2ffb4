"""``python -m benchmarks main-job``: its runs spec, its table by hand, bad input refused before anything runs, and a
clone that really runs its own script (the script's dry run, which trains nothing)."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks import main_job


def test_runs_are_refs_then_shell_words():
    assert main_job.parse_runs("bd412d4; HEAD --rollout.backend vllm --env.name 'webshop'") == [
        ("bd412d4", []), ("HEAD", ["--rollout.backend", "vllm", "--env.name", "webshop"])]


def _record(it, gen, upd, ckpt, invalid, flat):
    return {"iteration": it, "perf/iteration_s": gen + upd + 1.0, "perf/checkpoint_s": ckpt, "perf/generate_s": gen,
            "perf/update_s": upd, "rollout/invalid_format_frac": invalid, "rollout/flat_group_frac": flat}


def test_report_by_hand():
    old = main_job.JobResult("bd412d4", "bd412d4", [], 1000.0, [_record(1, 60.0, 200.0, 9.0, 0.16, 0.0),
                                                              _record(2, 80.0, 240.0, 10.0, 0.13, 0.0)])
    new = main_job.JobResult("HEAD", "abcdef0", ["--rollout.backend", "vllm"], 400.0, [_record(1, 30.0, 100.0, 4.0, 0.1, 0.5)])
    # before the first iteration: the wall minus every iteration's own time and its checkpoint
    assert old.setup_s == pytest.approx(1000.0 - (261.0 + 9.0) - (321.0 + 10.0))
    text = main_job.report([old, new])
    assert "bd412d4 (bd412d4): wall 1000 s, before the first iteration 399 s" in text
    assert "HEAD (abcdef0) --rollout.backend vllm: wall 400 s, before the first iteration 265 s" in text
    assert "   1     270    60.0   200.0   0.84  0.00" in text  # iteration + checkpoint, valid = 1 - invalid
    assert "   1     135    30.0   100.0   0.90  0.50" in text
    assert "HEAD: 2.50x faster than bd412d4" in text


@pytest.mark.parametrize("runs, named", [("nope123", "'nope123' is not a commit"), ("HEAD;", "--runs needs entries"),
                                         ("HEAD --x 'unclosed", "--runs: ")])
def test_bad_runs_are_one_line_before_anything_runs(runs, named, capsys, tmp_path):
    code = None
    try:
        code = main_job.main(["--runs", runs, "--out", str(tmp_path)])
    except SystemExit as exc:  # refused by the settings' own check
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and named in err, err
    assert not any(tmp_path.iterdir())  # nothing cloned


def test_a_data_folder_without_webshop_is_refused(tmp_path, capsys):
    assert main_job.main(["--runs", "HEAD", "--data", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "--data" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_clone_runs_its_own_script(tmp_path, monkeypatch, capsys, shared_data):
    """``PROGPO_DRY_RUN=1``: the clone's run_local.sh prints its train command and runs nothing, so the job writes no
    iteration and the benchmark says so, naming the run; the clone is at the ref, with ``../shared`` beside it."""
    monkeypatch.setenv("PROGPO_DRY_RUN", "1")
    assert main_job.main(["--runs", "HEAD --env.name alfworld", "--data", str(shared_data), "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "run 1 (HEAD)" in err and "wrote no iteration" in err
    clone = tmp_path / "run1" / "repo"
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert head == main_job.resolve_commit("HEAD")
    log = (tmp_path / "run1" / "job.log").read_text()
    assert "python3\n-m\nprogpo.cli.train" in log and "--env.name\nalfworld" in log
    assert (tmp_path / "run1" / "shared" / "data" / "webshop").is_dir()

