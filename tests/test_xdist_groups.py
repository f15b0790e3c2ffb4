"""The pytest-xdist groups (``progpo_tests.xdist_groups``, applied by ``tests/conftest.py``) name files that exist (a
renamed file would leave its group), and the suite hands them out slowest first."""

from __future__ import annotations

from pathlib import Path

from progpo_tests.xdist_groups import ENGINE_GROUP, FIRST_UNITS, RAY_JOB_FILES, RAY_JOB_GROUP, unit_order, xdist_group

REPO = Path(__file__).resolve().parents[1]


def test_every_ray_job_file_exists_and_is_grouped():
    for path in RAY_JOB_FILES:
        assert (REPO / path).is_file(), path
        assert xdist_group(f"{path}::test_x") == RAY_JOB_GROUP


def test_other_files_keep_their_own_group_and_engine_tests_share_one():
    assert xdist_group("tests/openrlhf/test_cpu_job_lora.py::test_x") == "tests/openrlhf/test_cpu_job_lora.py"
    assert xdist_group("tests/openrlhf/test_cpu_job.py::test_x", ("vllm_cpu_engine",)) == ENGINE_GROUP


def test_first_units_name_groups_that_exist():
    for group in FIRST_UNITS:
        assert group in (RAY_JOB_GROUP, ENGINE_GROUP) or (REPO / group).is_file(), group


def test_unit_order_puts_the_first_units_first_then_larger_groups_and_keeps_each_group_together():
    groups = ["a.py", "a.py", "b.py", ENGINE_GROUP, RAY_JOB_GROUP, "b.py", "c.py", "b.py", RAY_JOB_GROUP, "a.py"]
    order = unit_order(groups)
    assert sorted(order) == list(range(len(groups)))
    # the Ray jobs (in collection order), then a.py and b.py (3 tests each: first seen first), then the engine group and
    # c.py (1 test each; the engine group is not a first unit)
    assert order == [4, 8, 0, 1, 9, 2, 5, 7, 3, 6]
    ordered = [groups[i] for i in order]
    runs = [g for k, g in enumerate(ordered) if k == 0 or ordered[k - 1] != g]
    assert len(runs) == len(set(runs))  # every group is one contiguous run


def test_this_session_runs_in_unit_order_and_xdist_keeps_it(request):
    """The order conftest sets is this session's (each group one contiguous run, the slowest groups first, in
    FIRST_UNITS' order), and xdist's re-sorting by test count is off."""
    groups = [next(m.args[0] for m in item.iter_markers("xdist_group")) for item in request.session.items]
    runs = [g for k, g in enumerate(groups) if k == 0 or groups[k - 1] != g]
    assert len(runs) == len(set(runs))
    present = [g for g in FIRST_UNITS if g in runs]
    assert runs[:len(present)] == present
    assert getattr(request.config.option, "loadscopereorder", False) is False
