"""Shared pytest fixtures: where the real data is (never copied into the project), a real Qwen3 tokenizer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import settings

from progpo.paths import data_root

# Property tests draw the same examples on every run (a red CI must be reproducible, never a lucky draw).
settings.register_profile("progpo", derandomize=True, database=None)
settings.load_profile("progpo")

ENGINE_GROUP = "vllm_cpu_engine"
"""The pytest-xdist group of every test that uses the session's real vLLM engine (one engine per worker)."""


def xdist_group(nodeid: str, fixturenames: tuple[str, ...] = ()) -> str:
    """The pytest-xdist group of a test: :data:`ENGINE_GROUP` for the real-engine tests, else its file."""
    return ENGINE_GROUP if "vllm_cpu_engine" in fixturenames else nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the marks into the node ids
def pytest_collection_modifyitems(config, items):
    """pytest-xdist groups (``.ci/run`` runs ``-n 2 --dist loadgroup``): a test file's tests run in one worker, so
    its module fixtures (a whole CPU job) run once; the tests of the session's real vLLM engine share one
    worker, so one engine starts. Without xdist the marks do nothing."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item.nodeid, tuple(getattr(item, "fixturenames", ())))))
