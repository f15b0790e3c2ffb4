"""Waiting in tests on slow or loaded machines: one patience bound, and polling instead of sleeping.

Every wait of the test suite for something that is expected to happen (a WebShop server or a Ray
cluster to start, an HTTP answer, a subprocess to exit, a page to load in the browser) is bounded by
``PATIENCE_S``: seconds, from the environment variable ``PROGPO_TEST_PATIENCE_S`` (default 300).
A wait ends as soon as its condition holds, so a generous bound costs nothing on a fast machine,
while on a loaded 2-core machine (where a spaCy load or a Ray start can take minutes) slowness does
not turn into a failure. The bound only decides how long a *broken* run hangs before it fails.
Tests assert no latencies; speed figures belong in the benchmarks, which print them.

(Here rather than under ``tests/``: a site-packages ``tests`` package shadows the test folder as an
import name, and fixtures cannot reach module-level test helpers.)
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any, TypeVar

T = TypeVar("T")

PATIENCE_ENV = "PROGPO_TEST_PATIENCE_S"
DEFAULT_PATIENCE_S = 300.0


def patience_s() -> float:
    """``$PROGPO_TEST_PATIENCE_S`` as seconds (default 300).

    Raises:
        ValueError: the variable is set but not a finite number > 0 (names the variable).
    """
    raw = os.environ.get(PATIENCE_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_PATIENCE_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{PATIENCE_ENV} must be a number of seconds, got {raw!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{PATIENCE_ENV} must be a finite number of seconds > 0, got {raw!r}")
    return value


PATIENCE_S = patience_s()


def wait_until(condition: Callable[[], T], what: str, timeout_s: float | None = None,
               interval_s: float = 0.05) -> T:
    """Poll ``condition()`` until it returns a truthy value; return that value.

    Args:
        condition: called repeatedly; exceptions propagate.
        what: what is awaited, for the error message.
        timeout_s: give up after this many seconds (default ``PATIENCE_S``).
        interval_s: pause between polls, seconds.

    Raises:
        TimeoutError: ``condition`` stayed falsy for ``timeout_s`` seconds (names ``what``).
    """
    limit = PATIENCE_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not within {limit:g} s (raise {PATIENCE_ENV} on a slow machine)")
        time.sleep(interval_s)


class JsonHandler(BaseHTTPRequestHandler):
    """Request handler base of the tests' loopback stand-in servers (e.g. WebShop's session API): it logs
    nothing, and :meth:`send_json` writes one JSON answer."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        """Keep test output quiet."""

    def send_json(self, code: int, body: Any) -> None:
        """Answer HTTP status ``code`` with ``body`` as JSON."""
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
