"""Policy versions of step samples (``progpo.openrlhf.policy_clock``): the clock, the lag and mixed-group figures,
the overlap of generation and update, and the version a request records (``EngineGenerate``)."""

from __future__ import annotations

import asyncio
import pickle
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from progpo.openrlhf.policy_clock import (LAG_MAX, LAG_MEAN, MIXED_GROUPS, UNRECORDED, PolicyClock,
                                          mixed_version_groups, overlap_seconds, version_metrics)


def test_the_clock_counts_syncs():
    clock = PolicyClock()
    assert clock.version() == 0
    assert [clock.advance() for _ in range(3)] == [1, 2, 3] and clock.version() == 3


def test_version_figures_by_hand():
    # trainer at version 3; group a sampled under 2 (one step straddled 2 -> 3), group b under 1, c unrecorded
    uids = ["a", "a", "a", "b", "b", "c"]
    start = [2, 2, 2, 1, 1, UNRECORDED]
    end = [2, 3, 2, 1, 1, UNRECORDED]
    out = version_metrics(3, uids, start, end)
    assert out[LAG_MEAN] == pytest.approx((1 + 1 + 1 + 2 + 2) / 5)
    assert out[LAG_MAX] == 2
    assert out[MIXED_GROUPS] == 1  # a: one of its steps straddled a sync
    assert mixed_version_groups(uids, start, end) == ["a"]


def test_a_group_across_batches_of_versions_is_mixed_even_without_a_straddling_step():
    assert mixed_version_groups(["g", "g"], [4, 5], [4, 5]) == ["g"]
    assert mixed_version_groups(["g", "h"], [4, 5], [4, 5]) == []


def test_sync_mode_batch_has_lag_zero_and_nothing_unrecorded_is_counted():
    assert version_metrics(2, ["a", "b"], [2, 2], [2, 2]) == {LAG_MEAN: 0.0, LAG_MAX: 0.0, MIXED_GROUPS: 0.0}
    assert version_metrics(0, ["a"], [UNRECORDED], [UNRECORDED]) == {MIXED_GROUPS: 0.0}  # local backend: no lag


def test_bad_versions_are_refused_naming_what_is_wrong():
    with pytest.raises(ValueError, match="newer than the trainer's 1"):
        version_metrics(1, ["a"], [1], [2])
    with pytest.raises(ValueError, match="differ in length"):
        version_metrics(1, ["a", "b"], [1], [1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.booleans()), min_size=1, max_size=30),
       st.integers(0, 3))
def test_lag_is_within_the_versions_seen_for_any_batch(rows, extra):
    """Over any batch: lag = trainer - start, max lag <= trainer - oldest start, mixed groups are exactly those with
    two distinct start/end versions (the brute-force reading)."""
    uids = [f"g{g}" for _, g, _ in rows]
    start = [v for v, _, _ in rows]
    end = [v + int(straddle) for v, _, straddle in rows]
    trainer = max(end) + extra
    out = version_metrics(trainer, uids, start, end)
    assert out[LAG_MAX] == trainer - min(start) and out[LAG_MEAN] <= out[LAG_MAX]
    brute = {u for u in set(uids) if len({x for uu, a, b in zip(uids, start, end) if uu == u for x in (a, b)}) > 1}
    assert out[MIXED_GROUPS] == len(brute)


def test_overlap_by_hand():
    gen = [(0.0, 4.0), (6.0, 9.0)]
    train = [(3.0, 7.0), (8.0, 8.5)]
    assert overlap_seconds(gen, train) == pytest.approx(1.0 + 1.0 + 0.5)  # [3,4] + [6,7] + [8,8.5]
    assert overlap_seconds(gen, []) == 0.0
    assert overlap_seconds([(0, 2), (1, 3)], [(0, 10)]) == pytest.approx(3.0)  # a list overlapping itself: its union


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10)), max_size=6),
       st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10)), max_size=6))
def test_overlap_equals_a_grid_count(xs, ys):
    """On whole-number intervals the overlap is the number of unit cells covered by both unions."""
    first = [(a, a + d) for a, d in xs]
    second = [(a, a + d) for a, d in ys]
    cells = sum(1 for c in range(0, 60) if any(a <= c < b for a, b in first) and any(a <= c < b for a, b in second))
    assert overlap_seconds(first, second) == pytest.approx(cells)


def test_a_step_rollout_keeps_its_batch_through_pickle(cpu_compat):
    """The batch crosses OpenRLHF's async queue pickled: its samples and its episodes, stats and span arrive."""
    with cpu_compat.import_shims():
        from progpo.openrlhf.samples import StepRollout

    rollout = StepRollout([1, 2, 3], episodes=["e"], stats={"env/success": 0.5}, generation_span=(1.0, 2.5))
    back = pickle.loads(pickle.dumps(rollout))
    assert isinstance(back, StepRollout) and list(back) == [1, 2, 3]
    assert back.episodes == ["e"] and back.stats == {"env/success": 0.5} and back.generation_span == (1.0, 2.5)


class _Clock:
    """A clock whose version advances while a request is in flight (a sync inside it: partial rollout)."""

    def __init__(self, version: int) -> None:
        self.v = version
        self.version = SimpleNamespace(remote=self._read)

    def _read(self):
        async def value():
            return self.v
        return value()


class _Engine:
    def __init__(self, clock: _Clock | None, bump: bool) -> None:
        self.clock, self.bump = clock, bump

    async def generate(self, prompt_ids, params):
        if self.bump:
            self.clock.v += 1  # the trainer's sync lands while the request runs
        out = SimpleNamespace(token_ids=[5, 6], text="ab", finish_reason="stop",
                              logprobs=[{5: SimpleNamespace(logprob=-0.1)}, {6: SimpleNamespace(logprob=-0.2)}])
        return SimpleNamespace(outputs=[out])


@pytest.mark.parametrize("bump, versions", [(False, (3, 3)), (True, (3, 4))])
def test_a_request_records_the_version_before_and_after(cpu_compat, bump, versions):
    with cpu_compat.import_shims():
        from vllm import SamplingParams as VllmParams

        from progpo.agents.types import SamplingParams
        from progpo.openrlhf.agent import EngineGenerate

    clock = _Clock(3)
    gen = asyncio.run(EngineGenerate(_Engine(clock, bump), VllmParams(), clock)([1, 2], SamplingParams()))
    assert (gen.policy_version, gen.policy_version_end) == versions
    plain = asyncio.run(EngineGenerate(_Engine(None, False), VllmParams())([1, 2], SamplingParams()))
    assert (plain.policy_version, plain.policy_version_end) == (UNRECORDED, UNRECORDED)
