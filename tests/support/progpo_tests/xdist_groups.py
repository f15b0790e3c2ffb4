"""pytest-xdist groups of the suite and the order they are handed out in (``.ci/run`` runs ``-n 2 --dist loadgroup``;
``tests/conftest.py`` applies both)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

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


FIRST_UNITS = (RAY_JOB_GROUP, "tests/trainer/test_learns.py", "tests/trainer/test_vllm_local_engine.py",
               "tests/openrlhf/test_cpu_job_lora.py")
"""Groups handed out before all others, in this order: the ones that hold the suite's slowest tests (the
``--durations`` list .ci/run prints). A worker runs a group whole, so the suite's wall time is at least its
longest group's, and a long group handed out last adds its whole length after the other worker has run dry
(longest-processing-time-first scheduling). pytest-xdist's own order, by test count (``--loadscope-reorder``),
handed out the Ray-job group, which has few tests but the longest run, after the larger files. The real-engine group
(:data:`ENGINE_GROUP`) is not among them: its session's engine stays up until its worker ends, and started early it
would sit beside the whole Ray-job group's memory."""


def unit_order(groups: Sequence[str]) -> list[int]:
    """The order to run tests in, so that pytest-xdist (with ``loadscopereorder`` off: ``tests/conftest.py``) hands out
    the slowest groups (:data:`FIRST_UNITS`) first and the others by test count. A run without xdist uses the same
    order.

    Args:
        groups: ``[N]`` each collected test's group (:func:`xdist_group`), in collection order.

    Returns:
        ``[N]`` a permutation of ``range(N)``: the tests of :data:`FIRST_UNITS` first, in that order, then the other
        groups by test count, largest first (xdist's own order), ties by first appearance; inside a group, collection
        order, so a file's tests stay together and its module fixtures run once.
    """
    count = Counter(groups)
    first_seen: dict[str, int] = {}
    for i, g in enumerate(groups):
        first_seen.setdefault(g, i)
    rank = {g: k for k, g in enumerate(FIRST_UNITS)}

    def key(i: int) -> tuple[int, int, int, int]:
        g = groups[i]
        return (rank.get(g, len(FIRST_UNITS)), -count[g], first_seen[g], i)

    return sorted(range(len(groups)), key=key)
