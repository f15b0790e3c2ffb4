"""Fixtures of the WebShop server tests: one real server process (waitress, loopback, free port)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from envs.webshop_server.process import WebShopServerProcess
from progpo_tests.patience import PATIENCE_S


@pytest.fixture(scope="session")
def webshop_dir(shared_data):
    """The real WebShop data folder (87-product subset)."""
    path = shared_data / "webshop"
    if not path.is_dir():
        pytest.fail(f"WebShop data not found at {path}")
    return path


@pytest.fixture(scope="session")
def server(webshop_dir) -> Iterator[WebShopServerProcess]:
    """One server for the whole WebShop test area (started once, stopped at the end)."""
    proc = WebShopServerProcess(data_dir=webshop_dir, port=0, threads=16, start_timeout_s=PATIENCE_S)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def shop(webshop_dir):
    """An in-process Shop over the same data (for oracle computations in tests)."""
    from envs.webshop_server.shop import Shop, ShopConfig

    return Shop(ShopConfig(data_dir=str(webshop_dir)))
