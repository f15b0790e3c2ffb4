"""``progpo_tests.patience``: the suite's one patience bound and its polling helper."""

from __future__ import annotations

import itertools

import pytest

from progpo_tests import patience as testing


@pytest.mark.parametrize("raw, value", [(None, 300.0), ("", 300.0), ("900", 900.0), ("0.5", 0.5)])
def test_patience_from_the_environment(monkeypatch, raw, value):
    if raw is None:
        monkeypatch.delenv(testing.PATIENCE_ENV, raising=False)
    else:
        monkeypatch.setenv(testing.PATIENCE_ENV, raw)
    assert testing.patience_s() == value


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "nan", "inf"])
def test_bad_patience_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(testing.PATIENCE_ENV, raw)
    with pytest.raises(ValueError, match=testing.PATIENCE_ENV):
        testing.patience_s()


def test_wait_until_returns_the_first_truthy_value_and_names_what_timed_out():
    calls = itertools.count(1)
    assert testing.wait_until(lambda: max(0, next(calls) - 3), "the third poll", interval_s=0) == 1
    with pytest.raises(TimeoutError, match=r"the server: not within 0.01 s \(raise PROGPO_TEST_PATIENCE_S"):
        testing.wait_until(lambda: None, "the server", timeout_s=0.01, interval_s=0.001)
