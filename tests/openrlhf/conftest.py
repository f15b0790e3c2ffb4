"""Fixtures for the OpenRLHF path tests (``progpo/openrlhf``)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def openrlhf_stubs():
    """Our test-only stub module for flash_attn/vllm (``openrlhf_stubs.py``), loaded once by path.

    Loaded by file path because test folders are not packages (pytest importlib mode).
    """
    import importlib.util
    import sys

    name = "_progpo_openrlhf_stubs"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("openrlhf_stubs.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]
