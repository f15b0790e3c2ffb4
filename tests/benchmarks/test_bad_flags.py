"""Bench flags that used to crash deep inside (StatisticsError, "StepBatch is empty") or were taken
silently (NaN threshold) are refused by name."""

from __future__ import annotations

import pytest

from benchmarks import advantages
from research import fidelity


@pytest.mark.parametrize("flag", ["--runs", "--rollout.batch_size", "--rollout.n_samples_per_prompt", "--env.max_steps"])
def test_advantages_bench_counts_must_be_positive(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        advantages.main([flag, "0", "--no_embeddings"])
    out = capsys.readouterr()
    assert exc.value.code == 2 and f"error: {flag} must be >= 1, got 0" in out.err
    assert "machine:" not in out.out  # refused before any work


@pytest.mark.parametrize("bench, old", [
    ("advantages", "--tasks"), ("advantages", "--trajectories"), ("advantages", "--max-steps"),
    ("advantages", "--no-embeddings"), ("alfworld", "--max_steps"), ("alfworld", "--episodes_per_actor"),
    ("alfworld", "--seed"), ("train", "--n"), ("roofline", "--max_prompt_tokens"), ("webshop", "--episodes"),
    ("webshop", "--data-dir")])
def test_a_former_bench_flag_name_is_refused(bench, old, capsys):
    """No release carried the benches' former names: they are unknown flags, not deprecated aliases."""
    import importlib

    with pytest.raises(SystemExit) as exc:
        importlib.import_module(f"benchmarks.{bench}").main([old, "1"])
    assert exc.value.code == 2 and f"unrecognized arguments: {old} 1" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "-0.5"])
def test_fidelity_sign_threshold_must_be_finite_non_negative(value):
    with pytest.raises(ValueError, match="--sign_threshold"):
        fidelity.parse_args(["--sign_threshold", value])


def test_speed_bench_rows_are_the_published_estimators():
    # dataclasses.replace(progpo_config, estimator="hgpo") kept ProGPO's resolved depths 0 and per-task
    # zeroing, so the speed table timed HGPO with K = 0 and zeroing baselines
    from progpo.advantages import AdvantageConfig

    rows = advantages.bench_configs(50)
    for name in ("gigpo", "hgpo", "grpo", "rloo"):
        assert rows[name] == AdvantageConfig(estimator=name, max_steps=50), name
        assert rows[name].zero_signal == "off"
    assert rows["hgpo"].depths == 2 and rows["progpo"].depths == 0
    # ProGPO with closure potentials is timed on the product default otherwise
    assert rows["progpo potential_target=closure"] == AdvantageConfig(max_steps=50, potential_target="closure")
    # the peers' rows time their paper's settings
    assert (rows["crbc"].crbc_beta, rows["crbc"].omega, rows["graft"].graft_gamma, rows["pgpo"].estimator) == (
        0.98, 5.0, 0.99, "pgpo")


def test_a_data_folder_that_is_not_there_is_one_line(tmp_path, capsys):
    # a FileNotFoundError naming the folder ended the benchmark with a traceback
    from benchmarks.__main__ import main

    assert main(["alfworld", "--env.data_dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m benchmarks alfworld: error:") and "nope" in err[0], err
