"""Run the WebShop server as a subprocess (production WSGI server: waitress) and wait until healthy."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from envs.webshop_server.catalog import resolve_files
from envs.webshop_server.paths import CHECKOUT_ROOT

log = logging.getLogger(__name__)
_LISTENING = re.compile(r"LISTENING (http://\S+)")


class WebShopServerProcess:
    """A ``python -m envs.webshop_server`` subprocess bound to ``host:port``.

    Usable as a context manager. ``start()`` spawns the server and polls ``/health`` until it answers
    and (with ``wait_nlp``) reports the reward's spaCy pipeline loaded, or ``start_timeout_s``
    passes; ``stop()`` terminates it (SIGTERM, then SIGKILL after 5 s).

    Args:
        data_dir: WebShop data folder (None: :func:`~envs.webshop_server.paths.default_data_dir`).
        host: bind address; loopback by default.
        port: port; 0 picks a free one (the server prints the port it bound).
        num_products: keep only the first N products.
        products_file: products file name inside ``data_dir``.
        goal_source, split_mode, price_seed, threads, session_ttl_s, max_sessions: server flags.
        start_timeout_s: seconds to wait for a healthy (and, with ``wait_nlp``, ready) server; None:
            300 s plus 0.25 s per MiB of the products file (a first start on the 5 GB full catalog
            builds its cache for minutes).
        wait_nlp: also wait until ``/health`` says ``nlp_ready``: the server loads spaCy in a
            background thread after it starts answering, and requests that arrive meanwhile (the
            first purchase waits for the load; all compete with it for the CPU) can take tens of
            seconds on a loaded machine, past a client's timeout. False: return at the first
            ``/health`` answer (the benchmark measures that start time).
        extra_args: more command-line flags.

    Raises:
        FileNotFoundError: (from ``start``) missing data folder or catalog files.
        RuntimeError: (from ``start``) the server exited or did not become healthy in time; the
            message holds the tail of its log.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        num_products: int | None = None,
        *,
        products_file: str | None = None,
        goal_source: str = "auto",
        split_mode: str = "auto",
        price_seed: int = 0,
        threads: int = 8,
        session_ttl_s: float = 3600.0,
        max_sessions: int = 10_000,
        start_timeout_s: float | None = None,
        wait_nlp: bool = True,
        extra_args: list[str] | None = None,
    ) -> None:
        if not 0 <= port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {port}")
        if start_timeout_s is not None and not start_timeout_s > 0:
            raise ValueError(f"start_timeout_s must be > 0, got {start_timeout_s}")
        self.host, self.port = host, port
        self.start_timeout_s = start_timeout_s
        self.wait_nlp = wait_nlp
        args = ["--host", host, "--port", str(port), "--goal-source", goal_source,
                "--split-mode", split_mode, "--price-seed", str(price_seed), "--threads", str(threads),
                "--session-ttl-s", str(session_ttl_s), "--max-sessions", str(max_sessions)]
        if data_dir is not None:
            args += ["--data-dir", str(data_dir)]
        if num_products is not None:
            args += ["--num-products", str(num_products)]
        if products_file is not None:
            args += ["--products-file", products_file]
        self.args = args + list(extra_args or [])
        self.data_dir, self.products_file = data_dir, products_file
        self.url: str | None = None
        self.proc: subprocess.Popen | None = None
        self.start_seconds: float | None = None
        self._log: Any = None

    def start(self) -> str:
        """Spawn the server and wait for ``/health``; returns the base URL.

        Raises:
            FileNotFoundError: the data folder or its catalog files are missing (checked here,
                before any process starts, so the caller gets the message rather than a log tail).
            RuntimeError: the server exited or did not become healthy (see the class docstring).
        """
        if self.proc is not None:
            raise RuntimeError("server already started")
        files = resolve_files(self.data_dir, self.products_file)
        if self.start_timeout_s is None:
            self.start_timeout_s = 300.0 + 0.25 * files["products"].stat().st_size / 2**20
        self.url = None  # a failed earlier start may have seen another port
        self.start_seconds = None
        self._log = tempfile.NamedTemporaryFile("w+", prefix="webshop_server_", suffix=".log", delete=False)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT_ROOT), env.get("PYTHONPATH")]))
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "envs.webshop_server", *self.args],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=str(CHECKOUT_ROOT), env=env)
        try:
            return self._wait_healthy(t0)
        except BaseException:  # exited, timed out or interrupted: leave no process or log file behind
            self.stop()
            raise

    def _wait_healthy(self, t0: float) -> str:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"WebShop server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            if self.url is None:
                m = _LISTENING.search(Path(self._log.name).read_text(errors="replace"))
                if m:
                    self.url = m.group(1)
            health = self._health(deadline) if self.url is not None else None
            if health is not None:
                if self.start_seconds is None:  # answering: the start time (as the benchmark reports it)
                    self.start_seconds = time.perf_counter() - t0
                if not self.wait_nlp or health.get("nlp_ready"):
                    log.info("WebShop server at %s (%.2f s; ready after %.2f s)", self.url, self.start_seconds,
                             time.perf_counter() - t0)
                    return self.url
            time.sleep(0.05)  # polling interval, not a blind wait
        what = "ready (spaCy loaded)" if self.wait_nlp and self.start_seconds is not None else "healthy"
        raise RuntimeError(f"WebShop server not {what} after {self.start_timeout_s} s:\n{self.log_tail()}")

    def _health(self, deadline: float) -> dict[str, Any] | None:
        """One ``/health`` poll: its JSON when it answered 200, else None."""
        try:
            r = requests.get(f"{self.url}/health", timeout=max(0.5, min(10.0, deadline - time.monotonic())))
            return r.json() if r.status_code == 200 else None
        except (requests.RequestException, ValueError):
            return None

    def log_tail(self, n_chars: int = 4000) -> str:
        """The last ``n_chars`` of the server's log."""
        if self._log is None:
            return ""
        return Path(self._log.name).read_text(errors="replace")[-n_chars:]

    @property
    def pid(self) -> int | None:
        """Process id of the server (None before start)."""
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        """Terminate the server (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None
        if self._log is not None:
            self._log.close()
            try:
                os.unlink(self._log.name)
            except OSError:
                pass
            self._log = None

    def __enter__(self) -> "WebShopServerProcess":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
