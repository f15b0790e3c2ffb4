"""WebShopEnv against broken servers and bad arguments: EnvFailure (never a hang, never a fake
"invalid action") and ValueError naming the argument. Uses tiny loopback stand-in servers."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from progpo.envs.base import EnvFailure
from progpo.envs.webshop import WebShopEnv
from progpo_tests.patience import PATIENCE_S

VIEW = {"session_id": "s" * 24, "goal_index": 0, "instruction": "buy tea", "observation": "WebShop",
        "available_actions": {"has_search_bar": True, "clickables": ["search"]}, "url": "/x",
        "page": "index", "done": False, "reward": 0.0, "steps": 0, "valid": True, "message": ""}


def _serve(step_body: bytes, step_type: str = "application/json") -> tuple[ThreadingHTTPServer, str]:
    """A server whose POST /api/sessions answers a normal view and whose step answers ``step_body``."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output quiet
            pass

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/api/sessions":
                self._send(201, json.dumps(VIEW).encode(), "application/json")
            else:
                self._send(200, step_body, step_type)

        def do_DELETE(self):
            self._send(200, b"{}", "application/json")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.mark.parametrize("body, ctype", [
    (b"<html>not the WebShop API</html>", "text/html"),
    (b'{"observation": "x"}', "application/json"),  # JSON without the view fields
    (b"[1, 2]", "application/json"),
])
def test_garbled_server_answer_is_env_failure_not_invalid_action(body, ctype):
    httpd, url = _serve(body, ctype)
    try:
        env = WebShopEnv(url, timeout_s=PATIENCE_S)
        env.reset(split="test", index=0)
        with pytest.raises(EnvFailure, match="WebShop server"):
            env.step("search[tea]")
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts TCP connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_silent_server_times_out_as_env_failure(silent_server):
    """The client gives up after its ``timeout_s`` (read timeout) instead of hanging: EnvFailure.
    Only a hang is a failure here, so the bound is the suite's patience, not a latency."""
    env = WebShopEnv(silent_server, timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(EnvFailure, match="unreachable.*Read timed out"):
        env.reset(split="test", index=0)
    assert time.monotonic() - t0 < PATIENCE_S


def test_server_killed_mid_episode_is_env_failure():
    httpd, url = _serve(json.dumps(VIEW).encode())
    env = WebShopEnv(url, timeout_s=PATIENCE_S, connect_retries=0)  # a server back in time: test_webshop_restart.py
    env.reset(split="test", index=0)
    assert not env.step("search[tea]").done
    httpd.shutdown()
    httpd.server_close()
    with pytest.raises(EnvFailure, match="unreachable"):
        env.step("search[tea]")
    env.close()  # ignores the dead server


@pytest.mark.parametrize("kw, name", [
    (dict(timeout_s=0), "timeout_s"), (dict(timeout_s=-1), "timeout_s"), (dict(timeout_s=math.nan), "timeout_s"),
    (dict(timeout_s=None), "timeout_s"), (dict(timeout_s=math.inf), "timeout_s"),
    (dict(success_reward=math.nan), "success_reward"), (dict(success_reward=math.inf), "success_reward"),
    (dict(max_steps=math.nan), "max_steps"), (dict(max_steps=2.5), "max_steps"), (dict(max_steps="15"), "max_steps"),
    (dict(max_steps=True), "max_steps"),
])
def test_bad_constructor_arguments_name_the_argument(kw, name):
    with pytest.raises(ValueError, match=name):
        WebShopEnv("http://127.0.0.1:1", **kw)


def test_async_client_shares_the_answer_checks():
    """The OpenRLHF async WebShop env decodes answers with the same checks (EnvFailure on HTML)."""
    import asyncio

    import httpx

    from progpo.envs.http_pool import AsyncWebShopEnv

    httpd, url = _serve(b"<html>not the WebShop API</html>", "text/html")

    async def run() -> None:
        async with httpx.AsyncClient() as client:
            env = AsyncWebShopEnv(client, url, timeout_s=PATIENCE_S)
            await env.areset(split="test", index=0)
            with pytest.raises(EnvFailure, match="non-JSON"):
                await env.astep("search[tea]")

    try:
        asyncio.run(run())
    finally:
        httpd.shutdown()
        httpd.server_close()
