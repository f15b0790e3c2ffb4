"""The pytest-xdist groups (``progpo_tests.xdist_groups``, applied by ``tests/conftest.py``) name files that exist (a renamed file would leave its group)."""

from __future__ import annotations

from pathlib import Path

from progpo_tests.xdist_groups import ENGINE_GROUP, RAY_JOB_FILES, RAY_JOB_GROUP, xdist_group

REPO = Path(__file__).resolve().parents[1]


def test_every_ray_job_file_exists_and_is_grouped():
    for path in RAY_JOB_FILES:
        assert (REPO / path).is_file(), path
        assert xdist_group(f"{path}::test_x") == RAY_JOB_GROUP


def test_other_files_keep_their_own_group_and_engine_tests_share_one():
    assert xdist_group("tests/openrlhf/test_cpu_job_lora.py::test_x") == "tests/openrlhf/test_cpu_job_lora.py"
    assert xdist_group("tests/openrlhf/test_cpu_job.py::test_x", ("vllm_cpu_engine",)) == ENGINE_GROUP
