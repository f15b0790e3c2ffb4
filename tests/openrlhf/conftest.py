"""Fixtures for the OpenRLHF path tests (``progpo/openrlhf``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cpu_compat():
    """``progpo.openrlhf.cpu``: ``import_shims()`` lets OpenRLHF import without vLLM / flash-attn.

    Only the import shims are used in this process (they leave ``sys.modules`` when the block ends;
    whatever is not a real CPU implementation in them raises ``NeedsGPUStack`` when called). The
    runtime stand-ins (``install()``) change torch globally and run only in subprocesses / Ray workers.
    """
    from progpo.openrlhf import cpu as cpu_compat

    return cpu_compat
