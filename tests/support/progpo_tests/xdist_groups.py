"""pytest-xdist groups of the suite (``.ci/run`` runs ``-n 2 --dist loadgroup``; ``tests/conftest.py`` applies them)."""

from __future__ import annotations

ENGINE_GROUP = "vllm_cpu_engine"
"""The pytest-xdist group of every test that uses the session's real vLLM engine (one engine per worker)."""


RAY_JOB_GROUP = "ray_jobs"
RAY_JOB_FILES = ("tests/openrlhf/test_cpu_job.py", "tests/openrlhf/test_cpu_job_async.py",
                 "tests/openrlhf/test_cpu_job_faults.py")
"""Files whose tests run whole Ray jobs of several GiB (the two cluster-shaped jobs, the fault-injection jobs): one
group, so that no two of them run at once. The async cluster job beside a fault-injection job filled the 24 GiB
(Ray's memory monitor killed its workers in a 2-worker run, 2026-12-05)."""


def xdist_group(nodeid: str, fixturenames: tuple[str, ...] = ()) -> str:
    """The pytest-xdist group of a test: :data:`ENGINE_GROUP` for the real-engine tests, :data:`RAY_JOB_GROUP` for
    the files of :data:`RAY_JOB_FILES`, else its file."""
    if "vllm_cpu_engine" in fixturenames:
        return ENGINE_GROUP
    path = nodeid.split("::")[0]
    return RAY_JOB_GROUP if path in RAY_JOB_FILES else path
