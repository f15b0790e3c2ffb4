"""The learning run's report: figures read back from the files the script writes, plot and table."""

from __future__ import annotations

import json

import pytest

from progpo.cli import learning_report
from progpo.run.evaluation import mean_interval, rate_interval


def _eval(valid_answers: int, answers: int, scores: list[float], wins: int) -> dict:
    return {"episodes": len(scores), "failed_episodes": 0, "success": rate_interval(wins, len(scores)),
            "score": mean_interval(scores), "format_invalid": rate_interval(answers - valid_answers, answers)}


def test_report_reads_the_run_folder(tmp_path, capsys):
    out = tmp_path / "learn"
    (out / "rl").mkdir(parents=True)
    (out / "sft").mkdir()
    (out / "eval_base_train.json").write_text(json.dumps(_eval(0, 10, [0.0, 0.0], 0)))
    (out / "eval_sft_train.json").write_text(json.dumps(_eval(9, 10, [0.5, 0.25], 0)))
    (out / "eval_sft_test.json").write_text(json.dumps(_eval(8, 8, [1.0, 0.0, 0.5], 1)))
    (out / "rl" / "metrics.jsonl").write_text(
        json.dumps({"iteration": 1, "rollout/invalid_format_frac": 0.25, "env/score_mean": 0.4, "rollout/num_episodes": 8.0})
        + "\n")
    (out / "sft" / "sft_summary.json").write_text(json.dumps(
        {"expert_success": rate_interval(3, 4), "expert_score_mean": 0.9, "samples": 12,
         "epochs": [{"loss/sft_nll": 1.5}, {"loss/sft_nll": 0.5}]}))
    assert learning_report.main([str(out)]) == 0
    figures = json.loads((out / "learning.json").read_text())
    assert [p["stage"] for p in figures["train"]] == ["base", "SFT", "RL 1"]
    assert figures["train"][1]["valid"] == pytest.approx(0.9) and figures["train"][1]["score"] == pytest.approx(0.375)
    assert figures["train"][2] == pytest.approx({**figures["train"][2], "valid": 0.75, "score": 0.4, "episodes": 8})
    sft_test = figures["test"][0]
    assert sft_test["valid"] == 1.0 and sft_test["valid_low"] < 1.0  # Wilson interval of 8/8
    assert (out / "learning.png").stat().st_size > 10_000
    text = capsys.readouterr().out
    assert "won 3/4" in text and "| test | before RL (SFT) | 3 | 1.000 [" in text


def test_report_on_an_empty_folder_fails_cleanly(tmp_path, capsys):
    assert learning_report.main([str(tmp_path)]) == 2
    assert "run_local_learning.sh" in capsys.readouterr().err


@pytest.mark.parametrize("rel, text, says", [
    ("eval_base_train.json", '{"episodes": 3, "format', "not a readable JSON file"),  # cut short
    ("eval_sft_test.json", "{}", "not an evaluation written by progpo.cli.evaluate (KeyError"),
    ("eval_sft_test.json", "[1, 2]", "expected a JSON object, found list"),
    # a broken line inside the file (a torn LAST line is a kill's leftover, skipped: progpo.run.atomic)
    ("rl/metrics.jsonl", '{"iterat\n{"iteration": 1}\n', "not readable JSON lines"),
    ("rl/metrics.jsonl", '{"env/score_mean": 0.5}\n', "not the metrics of progpo.cli.train (KeyError"),
    ("sft/sft_summary.json", '{"samples": 3}', "not an sft summary of progpo.cli.sft (KeyError"),
    ("eval_rl_test.json/", None, "not a readable JSON file"),  # a folder where the file should be
])
def test_report_names_the_bad_file_and_writes_nothing(tmp_path, capsys, rel, text, says):
    out = tmp_path / "learn"
    (out / "rl").mkdir(parents=True)
    (out / "sft").mkdir()
    (out / "eval_sft_train.json").write_text(json.dumps(_eval(9, 10, [0.5, 0.25], 0)))  # a good file beside it
    if text is None:
        (out / rel).mkdir()
    else:
        (out / rel).write_text(text)
    assert learning_report.main([str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out / rel.rstrip('/')}: {says}"), err
    assert not (out / "learning.png").exists() and not (out / "learning.json").exists()


def test_report_on_a_file_says_it_is_not_a_folder(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert learning_report.main([str(tmp_path / "f")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_report_judges_the_rl_tasks_against_the_start_interval(tmp_path, capsys):
    out = tmp_path / "learn"
    out.mkdir()
    before = [0.0, 0.25, 0.5, 0.25, 0.0, 0.5]  # mean 0.25, 95% interval up to ~0.42
    (out / "eval_sft_rltasks.json").write_text(json.dumps(_eval(10, 10, before, 0)))
    (out / "eval_rl_rltasks.json").write_text(json.dumps(_eval(10, 10, [0.5, 0.5, 0.25, 0.5, 0.5, 0.5], 0)))
    assert learning_report.main([str(out)]) == 0
    figures = json.loads((out / "learning.json").read_text())
    v = figures["verdict"]
    assert v["before"] == pytest.approx(0.25) and v["after"] == pytest.approx(0.4583333)
    assert v["before_high"] == pytest.approx(mean_interval(before)["high"]) and v["above_start_interval"]
    # difference 0.2083; half-widths 1.96 * sd / sqrt(6): before sd 0.2236 -> 0.1789, after sd 0.1021 -> 0.0817
    assert v["diff"] == pytest.approx(0.2083333) and v["diff_low"] == pytest.approx(0.2083333 - 0.19668, abs=1e-4)
    assert v["diff_low"] > 0 and v["diff_high"] == pytest.approx(0.2083333 + 0.19668, abs=1e-4)
    text = capsys.readouterr().out
    assert "| RL tasks | before RL (SFT) | 6 | 1.000 [" in text and "above the start's interval" in text
    assert "difference +0.208 [+0.012, +0.405]: beyond noise" in text
    (out / "eval_rl_rltasks.json").write_text(json.dumps(_eval(10, 10, [0.25, 0.5, 0.25, 0.5, 0.25, 0.5], 0)))
    assert learning_report.main([str(out)]) == 0
    assert not json.loads((out / "learning.json").read_text())["verdict"]["above_start_interval"]
    assert "not above the start's interval" in capsys.readouterr().out
